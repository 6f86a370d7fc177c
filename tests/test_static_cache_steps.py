"""The static-cache decoder steps (fairseq_ext/decoding/transformer_step.py, lstm_step.py)
against fairseq's own full teacher-forced forward, and candidate decoding, DSS's pass
and the beam search with them against fairseq's incremental path (kept as the
reference and as the fallback):

- float64 to 1e-10 and float32 to 1e-5, per position, for `transformer` (post- and
  pre-norm, sinusoidal and learned positions), `lstm` (attention and input feeding;
  two layers, a bidirectional encoder, residual connections, an output projection,
  shared embeddings), `transformer_lm` and `lstm_lm` after a prefix, random and trained
  weights, with <pad> and <s> inside a history (the transformer masks and skips them
  as its full forward does; fairseq's incremental path does neither). fairseq's
  transformer attention softmax runs in float32 whatever the model's dtype: the
  float64 checks run it in float64;
- greedy and sampled candidates (top-k, min_len, forced prefixes): the same tokens and
  the same random numbers as fairseq's incremental path, scores equal to a
  teacher-forced rescoring, finished rows included;
- a decoder neither step covers decodes through fairseq's path, logged once.
"""
import logging

import copy

import pytest
import torch

import fairseq.models.lstm
import fairseq.utils
from fairseq_ext.decoding.candidates import (DecodeConfig, ParameterSets, _encode_sets, decode_candidates,
                                             decode_grouped, decode_with_greedy, grouped_reason)
from fairseq_ext.scoring.teacher_forced import sequence_log_probs
from fairseq_ext.decoding.steps import decoder_step, unsupported_reason
from fairseq_ext.decoding.transformer_step import TransformerStep
from fairseq_ext.decoding.lstm_step import LSTMStep
from fairseq_ext.decoding.batch import decode_inputs
from fairseq_ext.synthetic import tiny_models

VARIANTS = {  # name: (architecture, options)
    "post-norm, sinusoidal": ("transformer", []),
    # one head of 16: the differentiable step folds the attention's scale 1/4 into the queries
    "pre-norm, learned positions, one head": ("transformer", [
        "--decoder-normalize-before", "--encoder-normalize-before", "--decoder-learned-pos", "--encoder-learned-pos",
        "--decoder-attention-heads", "1", "--encoder-attention-heads", "1"]),
    "lstm": ("lstm", []),
    # residual connections have no option in fairseq's lstm: set on the decoder
    "lstm, 2 layers, bidirectional, residuals, out-embed 12, shared": (
        "lstm", ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-bidirectional", "--decoder-embed-dim",
                 "12", "--decoder-out-embed-dim", "12", "--share-decoder-input-output-embed"]),
}
# the transformers random and trained, the lstms trained (a random lstm's scores are all near 0)
TRANSLATION_MODELS = [(v, t) for v in VARIANTS for t in (False, True) if t or VARIANTS[v][0] == "transformer"]


def _train(model, task, steps=30):
    """A few Adam steps of MLE: weights that are not an initialisation."""
    task.load_dataset("train")
    ds = task.dataset("train")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = ds.collater([ds[i] for i in torch.randint(len(ds), (16,), generator=g).tolist()])
        lprobs = model.get_normalized_probs(model(**batch["net_input"]), log_probs=True)
        loss = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), batch["target"].view(-1),
                                            ignore_index=task.target_dictionary.pad())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module", params=TRANSLATION_MODELS,
                ids=[f"{v}, {'trained' if t else 'random'}" for v, t in TRANSLATION_MODELS])
def translation(request, toy_bin):
    variant, trained = request.param
    arch, options = VARIANTS[variant]
    task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", arch, options, seed=2)
    if arch == "lstm":
        model.decoder.residuals = "residuals" in variant
    if trained:
        _train(model, task)
    model.eval()
    task.load_dataset("valid")
    return task, model


@pytest.fixture(scope="module")
def language_model(toy_lm_bin):
    task, model, _ = tiny_models.build_task_and_model(toy_lm_bin, "text_completion", "transformer_lm",
                                                      ["--completion-context-size", "3"], seed=2)
    _train(model, task)
    task.load_dataset("valid")
    return task, model.eval()


@pytest.fixture(scope="module")
def lstm_language_model(toy_lm_bin):
    """fairseq's lstm_lm, 2 layers with residual connections, trained."""
    task, model, _ = tiny_models.build_task_and_model(toy_lm_bin, "text_completion", "lstm_lm",
                                                      ["--completion-context-size", "3", "--decoder-layers", "2",
                                                       "--residuals"], seed=2)
    _train(model, task)
    task.load_dataset("valid")
    return task, model.eval()


@pytest.fixture
def softmax_in_dtype(monkeypatch):
    """fairseq's attention softmax in the input's dtype (it casts to float32)."""
    monkeypatch.setattr(fairseq.utils, "softmax", lambda x, dim, onnx_trace=False: torch.softmax(x, dim))


def _batch(task, n=6):
    ds = task.dataset("valid")
    return ds.collater([ds[i] for i in range(n)])


def _with_specials(prev, d):
    """Histories with a <pad> and a <s> inside (not at the end, where padding is)."""
    prev = prev.clone()
    prev[0, 2], prev[1, 3], prev[2, 1] = d.pad(), d.bos(), d.pad()
    return prev


PATH = {True: "static-cache", False: "fairseq"}  # DecodeConfig.path, --decoding-path

def _stepwise(model, encoder_out, prev):
    step = decoder_step(model, encoder_out, torch.arange(prev.size(0)), prev.size(1))
    return torch.stack([step.logits(prev[:, t]) for t in range(prev.size(1))], 1)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_step_equals_the_full_forward_of_a_translation_model(translation, softmax_in_dtype, dtype, tol):
    task, model = translation
    assert unsupported_reason(model.decoder) is None
    model = model.to(dtype)
    try:
        sample = _batch(task)
        d = task.target_dictionary
        for prev in (sample["net_input"]["prev_output_tokens"], _with_specials(sample["net_input"]["prev_output_tokens"], d)):
            with torch.no_grad():
                enc = model.encoder.forward_torchscript(sample["net_input"])
                full = model.decoder(prev, encoder_out=enc)[0]
                lean = _stepwise(model, enc, prev)
            real = prev.ne(d.pad())  # outputs at <pad> positions are not used by anything
            assert (lean - full)[real].abs().max().item() < tol
            assert full.abs().max().item() > 1
    finally:
        model.float()


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("which", ["transformer_lm", "lstm_lm"])
def test_step_equals_the_full_forward_of_a_language_model_after_a_prefix(language_model, lstm_language_model,
                                                                         softmax_in_dtype, which, dtype, tol):
    task, model = language_model if which == "transformer_lm" else lstm_language_model
    assert unsupported_reason(model.decoder) is None
    assert which == "transformer_lm" or (model.decoder.residuals and model.decoder.num_layers == 2)
    model = model.to(dtype)
    try:
        sample = _batch(task)
        d = task.target_dictionary
        prefix = sample["prefix"]
        prev = torch.cat([torch.full((prefix.size(0), 1), d.eos()), prefix, sample["target"][:, :-1]], 1)
        for p in (prev, _with_specials(prev, d)):
            with torch.no_grad():
                full = model.decoder(p)[0]
                lean = _stepwise(model, None, p)
            real = p.ne(d.pad())
            assert (lean - full)[real].abs().max().item() < tol
    finally:
        model.float()


def test_fairseq_incremental_path_differs_from_its_full_forward_after_a_pad(translation):
    """Why the step follows the full forward: with a <pad> inside the history, fairseq's
    incremental decoding (no key mask for it, positions counted over it) gives other
    outputs than its full forward on the same tokens. (fairseq's LSTM has neither
    positions nor masks: its two paths are one function.)"""
    task, model = translation
    if isinstance(model.decoder, fairseq.models.lstm.LSTMDecoder):
        pytest.skip("fairseq's LSTM incremental path is its full forward")
    sample = _batch(task)
    prev = _with_specials(sample["net_input"]["prev_output_tokens"], task.target_dictionary)
    with torch.no_grad():
        enc = model.encoder.forward_torchscript(sample["net_input"])
        full = model.decoder(prev, encoder_out=enc)[0]
        state = {}
        inc = torch.cat([model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                         for t in range(prev.size(1))], 1)
    after = slice(3, 6)  # row 0, after its <pad> at position 2
    assert (inc[0, after] - full[0, after]).abs().max().item() > 1e-3
    real = prev[3].ne(task.target_dictionary.pad())  # a row without one, up to its end padding, agrees
    assert (inc[3, real] - full[3, real]).abs().max().item() < 1e-5


CONFIGS = [dict(), dict(strategy="sample", num_candidates=3), dict(strategy="sample", num_candidates=2, topk=5, min_len=3),
           dict(strategy="sample", num_candidates=2, temperature=1.5, topp=0.9)]


def _decode_both(task, model, cfg):
    sample = _batch(task, 12)
    batch, prefix = decode_inputs(sample, task.target_dictionary)
    out = [decode_candidates(model, batch, DecodeConfig(path=PATH[lean], max_len_b=12, **cfg), prefix_tokens=prefix,
                             generator=torch.Generator().manual_seed(3)) for lean in (True, False)]
    return batch, prefix, out


@pytest.mark.parametrize("cfg", CONFIGS, ids=["greedy", "sample", "topk_minlen", "temperature_topp"])
@pytest.mark.parametrize("which", ["transformer", "transformer_lm"])
def test_candidates_equal_fairseqs_incremental_path(translation, language_model, which, cfg):
    """The same tokens, lengths and finished flags as fairseq's path (the same random
    numbers for the same rows), scores within float error; every score is the
    teacher-forced log-probability of its tokens (rows that finished early included)."""
    task, model = translation if which == "transformer" else language_model
    batch, prefix, (lean, ref) = _decode_both(task, model, cfg)
    assert torch.equal(lean.tokens, ref.tokens) and torch.equal(lean.lengths, ref.lengths)
    assert torch.equal(lean.finished, ref.finished)
    assert (lean.scores - ref.scores).abs().max().item() < 1e-4
    with torch.no_grad():
        rescored = sequence_log_probs(model, batch, lean.as_list(), lean.source_index, prefix_tokens=prefix)
    assert (lean.scores - rescored).abs().max().item() < 1e-4
    if cfg.get("num_candidates") == 3:  # rows that finished early beside rows that ran to the limit
        assert lean.finished.any() and not lean.finished.all()


def _hooked(model):
    """A copy of ``model`` with a forward hook on a decoder module: the steps read
    parameters, not module calls, so they do not cover it."""
    model = copy.deepcopy(model)
    model.decoder.embed_tokens.register_forward_hook(lambda module, args, out: None)
    return model


def test_other_decoders_take_fairseqs_path_with_one_log_line(untrained_models, caplog, monkeypatch):
    """Candidate decoding and DSS's pass each say once that a decoder the steps do not
    cover (an lstm with a forward hook) takes fairseq's path."""
    from fairseq_ext.decoding import steps
    from fairseq_ext.decoding.dss_passes import run_scheduled_sampling

    task, model = untrained_models["lstm"]
    model = _hooked(model)
    monkeypatch.setattr(steps, "_FALLBACK_LOGGED", set())
    task.load_dataset("valid")
    sample = _batch(task)
    fed = torch.zeros_like(sample["net_input"]["prev_output_tokens"], dtype=torch.bool)
    with caplog.at_level(logging.INFO, logger="fairseq_ext.decoding.transformer_step"):
        for _ in range(2):
            c = decode_candidates(model, sample, DecodeConfig(max_len_b=5))
            run_scheduled_sampling(model, sample["net_input"], fed, "soft-argmax", 1.0)
    lines = [r.getMessage() for r in caplog.records if "incremental path" in r.getMessage()]
    assert len(lines) == 2 and all("LSTMDecoder" in line and "forward hooks" in line for line in lines)
    assert lines[0].startswith("candidate decoding:") and lines[1].startswith("scheduled sampling:")
    assert c.tokens.size(0) == 6


def _count_reorders(monkeypatch):
    """The rows kept by each ``reorder`` of either step, as a list filled as they happen."""
    kept = []
    for cls in (TransformerStep, LSTMStep):
        monkeypatch.setattr(cls, "reorder", lambda self, index, keep=cls.reorder: (kept.append(index.numel()),
                                                                                   keep(self, index)))
    return kept


def _eos_biased(model, task, eos_bias):
    """A copy of ``model`` whose output layer adds ``eos_bias`` to EOS's score (an lstm's
    shared output embedding becomes a copy of it, with the bias)."""
    model = copy.deepcopy(model)
    d = model.decoder
    lstm = isinstance(d, fairseq.models.lstm.LSTMDecoder)
    weight = (d.embed_tokens.weight if d.share_input_output_embed else d.fc_out.weight) if lstm \
        else d.output_projection.weight
    new = torch.nn.Linear(weight.size(1), weight.size(0), bias=True).to(weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        new.bias.zero_()
        new.bias[task.target_dictionary.eos()] = eos_bias
    if lstm:
        d.fc_out, d.share_input_output_embed = new, False
    else:
        d.output_projection = new
    return model


@pytest.mark.parametrize("eos_bias", [0.0, 3.0])
@pytest.mark.parametrize("which", ["transformer", "transformer_lm"])
def test_samples_and_greedy_in_one_decode_equal_two_decodes_on_fairseqs_path(translation, language_model, which,
                                                                             eos_bias):
    """``decode_with_greedy`` (the greedy rows after the sampled ones, one static-cache
    decode) gives the samples and the greedy candidates of two decodes on fairseq's path:
    the same tokens and finished flags, the same random numbers for the sampled rows,
    also where rows finish early and leave the caches (EOS bias 3)."""
    task, model = translation if which == "transformer" else language_model
    model = _eos_biased(model, task, eos_bias)
    sample = _batch(task, 12)
    batch, prefix = decode_inputs(sample, task.target_dictionary)
    cfg = dict(strategy="sample", num_candidates=3, topk=5, max_len_b=12)
    cand, greedy = decode_with_greedy(model, batch, DecodeConfig(**cfg), prefix_tokens=prefix,
                                      generator=torch.Generator().manual_seed(3))
    ref = decode_candidates(model, batch, DecodeConfig(path="fairseq", **cfg), prefix_tokens=prefix,
                            generator=torch.Generator().manual_seed(3))
    ref_greedy = decode_candidates(model, batch, DecodeConfig(path="fairseq", max_len_b=12), prefix_tokens=prefix)
    for got, want in ((cand, ref), (greedy, ref_greedy)):
        assert got.num_per_input == want.num_per_input
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.lengths, want.lengths)
        assert torch.equal(got.finished, want.finished)
        assert (got.scores - want.scores).abs().max().item() < 1e-4
    if eos_bias:  # rows finished at different steps
        assert cand.finished.any() and cand.lengths.unique().numel() > 1
    assert not torch.equal(cand.tokens[::3, :5], greedy.tokens[:, :5])  # the sampled rows were sampled


@pytest.mark.parametrize("eos_bias", [2.0, 3.0])
@pytest.mark.parametrize("which", ["transformer", "transformer_lm"])
def test_rows_that_finish_leave_the_caches_together(translation, language_model, which, eos_bias, monkeypatch):
    """EOS made likelier (a bias on its output row, not a hook: the step reads parameters),
    so rows finish at different steps: once at most half still run, the finished ones leave
    every cache together (TransformerStep.reorder); tokens and scores stay fairseq's path's,
    greedy and sampled, after a forced prefix too."""
    task, model = translation if which == "transformer" else language_model
    model = _eos_biased(model, task, eos_bias)
    kept = _count_reorders(monkeypatch)
    for cfg in (dict(), dict(strategy="sample", num_candidates=3)):
        _, _, (lean, ref) = _decode_both(task, model, cfg)
        assert torch.equal(lean.tokens, ref.tokens) and torch.equal(lean.finished, ref.finished)
        assert (lean.scores - ref.scores).abs().max().item() < 1e-4
    assert kept, "no compaction happened"


@pytest.mark.parametrize("options,reason", [
    (["--adaptive-input", "--adaptive-input-cutoff", "20"], "AdaptiveInput token embeddings (adaptive input)"),
    (["--adaptive-softmax-cutoff", "20"], "adaptive softmax"),
])
def test_adaptive_input_or_softmax_take_fairseqs_path(toy_lm_bin, options, reason):
    """A transformer_lm with adaptive input or adaptive softmax is not covered; the reason names it."""
    _, model, _ = tiny_models.build_task_and_model(toy_lm_bin, "text_completion", "transformer_lm",
                                                   ["--completion-context-size", "3"] + options)
    assert unsupported_reason(model.decoder) == reason


def test_layerdrop_is_covered_in_eval_mode_only(toy_lm_bin):
    """LayerDrop skips layers at random in training (the step runs every layer); in eval mode
    it skips none, and the step covers the model."""
    _, model, _ = tiny_models.build_task_and_model(toy_lm_bin, "text_completion", "transformer_lm",
                                                   ["--completion-context-size", "3", "--decoder-layerdrop", "0.2"])
    assert unsupported_reason(model.decoder.train()) == "LayerDrop (the step runs every layer)"
    assert unsupported_reason(model.decoder.eval()) is None


def _parameter_sets(model, count, scale=0.05, seed=0):
    """``count`` sets of values for ``model``'s parameters: its own, then perturbed ones;
    with the models that hold each set (copies of ``model``)."""
    g = torch.Generator().manual_seed(seed)
    stacks = {p: torch.stack([p.detach()] + [p.detach() + scale * torch.randn(p.shape, generator=g).to(p.dtype)
                                             for _ in range(count - 1)]) for p in model.parameters()}
    models = []
    for k in range(count):
        m = copy.deepcopy(model)
        with torch.no_grad():
            for q, p in zip(m.parameters(), model.parameters()):
                q.copy_(stacks[p][k])
        models.append(m.eval())
    return ParameterSets(count, lambda p: stacks[p]), models


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("which", ["transformer", "transformer_lm"])
def test_grouped_step_equals_each_sets_full_forward(translation, language_model, softmax_in_dtype, which, dtype, tol):
    """Three parameter sets stepped together (grouped weights, each block of rows with its
    set's encoder output): block g's outputs are the full teacher-forced forward of the
    model holding set g (a copy of the model with those values loaded)."""
    task, model = translation if which == "transformer" else language_model
    model = copy.deepcopy(model).to(dtype)
    sets, models = _parameter_sets(model, 3)
    sample = _batch(task)
    d = task.target_dictionary
    if which == "transformer":
        prev = _with_specials(sample["net_input"]["prev_output_tokens"], d)
    else:
        prefix = sample["prefix"]
        prev = _with_specials(torch.cat([torch.full((prefix.size(0), 1), d.eos()), prefix,
                                         sample["target"][:, :-1]], 1), d)
    b = prev.size(0)
    with torch.no_grad():
        enc = _encode_sets(model.encoder, sample["net_input"], sets) if which == "transformer" else None
        expand = torch.arange(3 * b) if enc is not None else torch.arange(b).repeat(3)
        step = decoder_step(model, enc, expand, prev.size(1), sets.stack, 3)
        lean = torch.stack([step.logits(prev.repeat(3, 1)[:, t]) for t in range(prev.size(1))], 1)
        real = prev.ne(d.pad())
        for k, m in enumerate(models):
            full = m.decoder(prev, encoder_out=m.encoder.forward_torchscript(sample["net_input"]))[0] \
                if which == "transformer" else m.decoder(prev)[0]
            assert (lean[k * b:(k + 1) * b] - full)[real].abs().max().item() < tol
        assert (lean[:b] - lean[b:2 * b]).abs().max().item() > 1e-3  # the sets differ


@pytest.mark.parametrize("which", ["transformer", "transformer_lm"])
def test_grouped_decode_equals_each_sets_decode_on_fairseqs_path(translation, language_model, which, monkeypatch):
    """``decode_grouped`` of four parameter sets: set g's candidates are those of
    ``decode_candidates`` on fairseq's path for the model holding set g (tokens, lengths,
    finished flags; scores to float error), greedy and sampled (each set from its own
    generator, seeded as the lone decode's), also where rows finish at different steps and
    leave the caches (EOS biases 2-4), a row leaving only once it finished in every set."""
    task, biased = translation if which == "transformer" else language_model
    kept = _count_reorders(monkeypatch)
    sample = _batch(task, 12)
    batch, prefix = decode_inputs(sample, task.target_dictionary)
    for eos_bias, cfg in ((0.0, dict()), (2.0, dict()), (3.0, dict()), (4.0, dict()),
                          (0.0, dict(strategy="sample", num_candidates=2, topk=10)),
                          (3.0, dict(strategy="sample", num_candidates=2))):
        model = _eos_biased(biased, task, eos_bias)
        sets, models = _parameter_sets(model, 4)
        gens = [torch.Generator().manual_seed(7) for _ in range(4)] if cfg else None
        got = decode_grouped(model, batch, DecodeConfig(max_len_b=12, **cfg), sets, prefix_tokens=prefix,
                             generators=gens)
        assert len(got) == 4
        for cand, m in zip(got, models):
            want = decode_candidates(m, batch, DecodeConfig(path="fairseq", max_len_b=12, **cfg), prefix_tokens=prefix,
                                     generator=torch.Generator().manual_seed(7))
            assert torch.equal(cand.tokens, want.tokens) and torch.equal(cand.lengths, want.lengths)
            assert torch.equal(cand.finished, want.finished)
            assert (cand.scores - want.scores).abs().max().item() < 1e-4
        assert any(not torch.equal(got[0].tokens, c.tokens) for c in got[1:])  # the sets decode differently
    assert kept and all(n % 4 == 0 for n in kept)


def test_grouped_decoding_refuses_what_it_does_not_cover(untrained_models, translation):
    task, model = translation
    sets, _ = _parameter_sets(model, 2)
    batch = _batch(task)
    with pytest.raises(ValueError, match="beam decoding"):
        decode_grouped(model, batch, DecodeConfig(strategy="beam", num_candidates=2), sets)
    with pytest.raises(ValueError, match="one generator per parameter set"):
        decode_grouped(model, batch, DecodeConfig(strategy="sample", num_candidates=2), sets)
    assert grouped_reason(untrained_models["lstm"][1], DecodeConfig()) is None
    assert "forward hooks" in grouped_reason(_hooked(untrained_models["lstm"][1]), DecodeConfig())


@pytest.mark.parametrize("mode", ["soft-argmax", "hard-argmax", "soft-sample"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_scheduled_sampling_pass_equals_fairseqs_incremental_pass(translation, softmax_in_dtype, mode, dtype, tol):
    """DSS's exact left-to-right pass on the differentiable static-cache step against the
    same pass through fairseq's incremental decoding, in train mode (dropout 0.1 drawn from
    the same random state; Gumbel noise from its own generator): the scores at every real
    position and the gradient of a loss on them with respect to every parameter."""
    from fairseq_ext.decoding.dss_passes import make_noise_fn, run_scheduled_sampling

    task, model = translation
    model = copy.deepcopy(model).to(dtype).train()
    sample = _batch(task, 8)
    prev, pad = sample["net_input"]["prev_output_tokens"], task.target_dictionary.pad()
    fed = torch.rand(prev.shape, generator=torch.Generator().manual_seed(4)) < 0.5
    fed[:, 0] = False
    fed &= prev.ne(pad)
    real = sample["target"].ne(pad)
    out = []
    for lean in (True, False):
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        noise = make_noise_fn(mode, torch.Generator().manual_seed(5))
        logits, steps = run_scheduled_sampling(model, sample["net_input"], fed, mode, 2.0, noise_fn=noise, path=PATH[lean])
        lprobs = torch.log_softmax(logits, -1).gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1)
        (-(lprobs * real).sum()).backward()
        out.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (lean_logits, lean_grads), (ref_logits, ref_grads) = out
    assert (lean_logits - ref_logits)[real].abs().max().item() < tol
    for a, b in zip(lean_grads, ref_grads):
        assert (a - b).abs().max().item() <= tol * max(b.abs().max().item(), 1.0)
    assert fed.any() and ref_logits[real].abs().max().item() > 1


@pytest.mark.parametrize("hard,open_length", [(False, False), (False, True), (True, True)],
                         ids=["soft", "soft, open length", "hard, open length"])
def test_beam_search_equals_its_search_on_fairseqs_path(translation, softmax_in_dtype, hard, open_length):
    """The soft beam (and the hard one) on the differentiable static-cache step against the
    same search on fairseq's incremental path (the embedding hook, ``SoftReorder``), in
    train mode (dropout 0.1) for each dropout mode, both from the same random state:
    final scores, costs, hypotheses, and the gradient of the direct loss with respect to
    every parameter, float64 to 1e-10. Sentences of different horizons leave the batch
    at different steps; with ``open_length`` elements finish at EOS."""
    from fairseq_ext.core.beam_relaxation import hamming_step_costs, open_length_hamming_costs, soft_beam_loss
    from fairseq_ext.decoding.beam_search import DROPOUT_MODES, run_beam

    task, model = translation
    model = copy.deepcopy(model).double().train()
    sample = _batch(task, 6)
    d = task.target_dictionary
    target = sample["target"]
    horizon = target.ne(d.pad()).sum(1) + (2 if open_length else 0)
    assert horizon.unique().numel() > 2
    if open_length:
        costs = open_length_hamming_costs(target, int(horizon.max()), len(d), d.eos(), d.pad())
    else:
        costs = hamming_step_costs(target, len(d), ignore_index=d.pad())
    compared = 0
    for dropout in DROPOUT_MODES:
        out = []
        for lean in (True, False):
            torch.manual_seed(0)
            model.zero_grad(set_to_none=True)
            result = run_beam(model, sample["net_input"], horizon, 3, alpha=10.0, step_costs=costs, hard=hard,
                              stop_at_eos=open_length, dropout=dropout, path=PATH[lean])
            soft_beam_loss(result.scores, result.costs, 10.0).sum().backward()
            out.append((result, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        (lean_result, lean_grads), (ref_result, ref_grads) = out
        finite = torch.isfinite(ref_result.scores)
        assert torch.equal(finite, torch.isfinite(lean_result.scores)) and finite.any()
        assert (lean_result.scores - ref_result.scores)[finite].abs().max().item() < 1e-10, dropout
        assert (lean_result.costs - ref_result.costs)[finite].abs().max().item() < 1e-10, dropout
        # hypotheses: of the sentences whose elements end with distinct scores (elements the soft
        # backpointers made equal stay equal, and their hard outputs are ties broken by rounding)
        gaps = ref_result.scores.sort(-1).values.diff(dim=-1).nan_to_num(1.0)
        distinct = gaps.gt(1e-6).all(-1)
        assert torch.equal(lean_result.tokens[distinct], ref_result.tokens[distinct]), dropout
        compared += int(distinct.sum())
        assert lean_grads.keys() == ref_grads.keys() and len(ref_grads) > 10
        for name, g in ref_grads.items():
            assert (lean_grads[name] - g).abs().max().item() <= 1e-10 * max(g.abs().max().item(), 1.0), (dropout, name)
    assert compared >= 3


def test_scheduled_sampling_pass_under_autocast_is_as_close_to_float32_as_fairseqs(translation):
    """Under autocast (--amp; here the CPU's bfloat16) the differentiable step's products run
    in half precision and its collected weight gradients come back in each parameter's
    float32. DSS's pass through the step under autocast is as close to the float32 pass as
    fairseq's incremental pass under the same autocast is: its scores and its gradient (all
    parameters together) within 1.5 times fairseq's error plus 1% (the two round differently:
    measured errors 0.3-1.3% of the scores' norm, 1-11% of the gradient's, for either path).
    Dropout off: a mask drawn for a bfloat16 tensor is not the one drawn for a float32
    tensor, and the two paths drop some tensors in different dtypes."""
    from fairseq_ext.decoding.dss_passes import run_scheduled_sampling

    task, model = translation
    model = copy.deepcopy(model).train()
    for module in model.modules():
        if hasattr(module, "p") and isinstance(module.p, float):
            module.p = 0.0
    sample = _batch(task, 8)
    prev, pad = sample["net_input"]["prev_output_tokens"], task.target_dictionary.pad()
    fed = (torch.rand(prev.shape, generator=torch.Generator().manual_seed(4)) < 0.5) & prev.ne(pad)
    fed[:, 0] = False
    real = sample["target"].ne(pad)
    runs = {}
    for lean, amp in ((True, True), (False, True), (False, False)):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits, _ = run_scheduled_sampling(model, sample["net_input"], fed, "soft-argmax", 2.0, path=PATH[lean])
            lprobs = torch.log_softmax(logits.float(), -1).gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1)
        (-(lprobs * real).sum()).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert all(g.dtype == torch.float32 for g in grads.values())
        runs[lean, amp] = (logits.detach().float()[real], torch.cat([grads[n].flatten() for n in sorted(grads)]))
    exact_logits, exact_grad = runs[False, False]

    def error(run):
        logits, grad = runs[run]
        return ((logits - exact_logits).norm() / exact_logits.norm()).item(), ((grad - exact_grad).norm()
                                                                             / exact_grad.norm()).item()
    for ours, theirs in zip(error((True, True)), error((False, True))):
        assert 0 < ours <= 1.5 * theirs + 0.01, (ours, theirs)
