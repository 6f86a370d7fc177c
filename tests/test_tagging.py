"""Sequence tagging substrate: conlleval scoring, the ``sequence_tagging`` task,
the ``tagging_lstm`` model (fixed attention, incremental decoding, forced length)
and end-to-end runs through fairseq-train / fairseq-generate / score_tagging.py
on a small written fixture and on CoNLL-2003 ($FAIRSEQ_EXT_DATA)."""
import argparse
import json
import os

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks, utils

from conftest import REPO, run_cli
from fairseq_ext.core import tagging_metrics
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates

SCORER = os.path.join(REPO, "scripts", "score", "score_tagging.py")

# --------------------------------------------------------------------- helpers

def build(data, cache_dir, *extra, arch="tagging_lstm_tiny", seed=1):
    """(task, model) as fairseq-train builds them; the model in eval mode."""
    torch.manual_seed(seed)
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [data, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--task", "sequence_tagging",
         "--tagging-cache-dir", cache_dir, "--arch", arch, "--seed", str(seed)] + list(extra),
    )
    task = tasks.setup_task(args)
    model = task.build_model(args)
    model.eval()
    return task, model


def batch(task, split="test", n=12):
    task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(min(n, len(ds)))])


def teacher_forced_lprobs(model, sample):
    net = sample["net_input"]
    out = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    return model.get_normalized_probs(out, log_probs=True)


def generate(task, model, sample, **gen_args):
    gen = task.build_generator([model], argparse.Namespace(**gen_args))
    return gen.generate([model], sample)


# --------------------------------------------------------------------- scoring

GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "I-ORG", "O"],
        ["I-MISC", "I-MISC", "O", "B-PER"], ["B-PER", "I-PER"]]
PRED = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "I-ORG", "I-ORG", "I-ORG", "O"],
        ["B-MISC", "I-MISC", "O", "I-LOC"], ["B-PER", "I-LOC"]]


def test_conlleval_f1_hand_checked(tmp_path):
    """Gold chunks: PER, LOC | ORG | MISC (I- opening a sentence starts a chunk), PER | PER.
    Predicted: PER, ORG | ORG (O I-ORG: broken BIO starts a chunk, same span as gold) |
    MISC, LOC (I-LOC after O) | PER, LOC (a type change inside a chunk splits it).
    Correct: PER (s1), ORG (s2), MISC (s3) -> P = 3/7, R = 3/6, F1 = 46.15; 10/15 tokens."""
    res = tagging_metrics.chunk_scores(GOLD, PRED)
    assert (res["correct"], res["predicted"], res["gold"]) == (3, 7, 6)
    assert res["precision"] == pytest.approx(100 * 3 / 7)
    assert res["recall"] == pytest.approx(50.0)
    assert res["f1"] == pytest.approx(2 * (3 / 7) * 0.5 / (3 / 7 + 0.5) * 100)
    assert res["f1"] == pytest.approx(46.1538, abs=1e-4)
    assert res["accuracy"] == pytest.approx(100 * 10 / 15)
    per = res["per_type"]
    assert (per["PER"]["gold"], per["PER"]["predicted"], per["PER"]["correct"]) == (3, 2, 1)
    assert per["ORG"]["precision"] == pytest.approx(50.0) and per["ORG"]["recall"] == pytest.approx(100.0)
    assert per["LOC"]["f1"] == 0.0 and per["MISC"]["f1"] == pytest.approx(100.0)
    assert res["f1_macro"] == pytest.approx((40.0 + 0.0 + 200 / 3 + 100.0) / 4)  # PER, LOC, ORG, MISC

    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("".join(" ".join(s) + "\n" for s in PRED))
    ref.write_text("".join(" ".join(s) + "\n" for s in GOLD))
    out = run_cli(["python", SCORER, "--hyp", str(hyp), "--ref", str(ref), "--json", "-"])
    js = json.loads(out.stdout)
    assert js["scheme"] == "chunk" and js["f1"] == pytest.approx(46.1538, abs=1e-4)
    tok = json.loads(run_cli(["python", SCORER, "--hyp", str(hyp), "--ref", str(ref), "--scheme", "token",
                              "--json", "-"]).stdout)
    assert tok["accuracy"] == pytest.approx(100 * 10 / 15)
    # B-PER: gold 3 tokens, predicted 2, both predictions right
    b_per = tok["per_label"]["B-PER"]
    assert (b_per["precision"], b_per["recall"]) == (100.0, pytest.approx(200 / 3))


# --------------------------------------------------------------------- task

def test_task_reads_conll(conll, cache):
    before = sorted(os.listdir(conll))
    task, _ = build(conll, cache, "--tagging-lowercase", "--tagging-normalize-digits")
    raw = [s for s in open(os.path.join(conll, "dev.txt")).read().split("\n\n") if s.strip()]
    raw = [s for s in raw if not s.startswith("-DOCSTART-")]
    task.load_dataset("valid")  # fairseq's valid split is dev.txt
    ds = task.dataset("valid")
    assert len(ds) == len(raw)
    item = ds[0]
    words = [line.split()[0] for line in raw[0].splitlines()]
    tags = [line.split()[-1] for line in raw[0].splitlines()]
    eos = task.target_dictionary.eos()
    assert len(item["source"]) == len(item["target"]) == len(words) + 1
    assert int(item["source"][-1]) == int(item["target"][-1]) == eos
    assert task.target_dictionary.string(item["target"]).split() == tags
    assert task.source_dictionary.string(item["source"]).split() == [
        w.lower().replace("1996", "0000") for w in words
    ]
    assert sorted(os.listdir(conll)) == before, "nothing may be written into the data directory"
    labels = task.target_dictionary.symbols[task.target_dictionary.nspecial:]
    assert labels == ["B-LOC", "B-ORG", "B-PER", "I-ORG", "I-PER", "O"]

    pos_task, _ = build(conll, cache, "--tagging-column", "pos")
    assert "NNP" in pos_task.target_dictionary.indices and "B-PER" not in pos_task.target_dictionary.indices
    pos_task.load_dataset("test")
    s = pos_task.dataset("test")
    assert all(s.src.sizes[i] == s.tgt.sizes[i] for i in range(len(s)))


# --------------------------------------------------------------------- model

@pytest.mark.parametrize("extra", [[], ["--encoder-unidirectional"]])
def test_incremental_equals_teacher_forced(conll, cache, extra):
    """Step-by-step decoding with the gold labels as inputs (and a batch reorder
    half-way, as beam search does) gives the teacher-forced scores; so does a
    left-padded batch."""
    task, model = build(conll, cache, *extra)
    sample = batch(task)
    full = teacher_forced_lprobs(model, sample)
    net = sample["net_input"]
    prev = net["prev_output_tokens"]
    enc = model.encoder(net["src_tokens"], net["src_lengths"])
    perm = torch.randperm(prev.size(0))
    state = {}
    steps = []
    order = torch.arange(prev.size(0))
    with torch.no_grad():
        for t in range(prev.size(1)):
            if t == prev.size(1) // 2:
                order = order[perm]
                model.decoder.reorder_incremental_state_scripting(state, perm)
                enc = model.encoder.reorder_encoder_out(enc, perm)
            out = model.decoder(prev[order, : t + 1], encoder_out=enc, incremental_state=state)
            lp = model.get_normalized_probs(out, log_probs=True)[:, -1]
            steps.append(torch.empty_like(lp).index_copy_(0, order, lp))
    incremental = torch.stack(steps, dim=1)
    mask = sample["target"].ne(task.target_dictionary.pad())
    assert torch.allclose(incremental[mask], full[mask], atol=1e-5)

    pad = task.source_dictionary.pad()
    left = utils.convert_padding_direction(net["src_tokens"], pad, right_to_left=True)
    assert not torch.equal(left, net["src_tokens"])
    out_left = model(left, net["src_lengths"], prev)
    lp_left = model.get_normalized_probs(out_left, log_probs=True)
    assert torch.allclose(lp_left[mask], full[mask], atol=1e-5)


def test_beam1_equals_greedy(conll, cache):
    task, model = build(conll, cache)
    sample = batch(task)
    hypos = generate(task, model, sample, beam=1)
    cand = decode_candidates(model, sample, DecodeConfig(strategy="greedy"))
    for i, nbest in enumerate(hypos):
        ref = nbest[0]["tokens"]
        assert cand.as_list()[i].tolist() == ref.tolist()
        assert cand.scores[i].item() == pytest.approx(nbest[0]["positional_scores"].sum().item(), abs=1e-4)
    # greedy is self-consistent: fed back under teacher forcing, every label is the argmax
    out = cand.tokens
    prev = torch.cat([out.new_full((out.size(0), 1), task.target_dictionary.eos()), out[:, :-1]], dim=1)
    net = sample["net_input"]
    lp = model.get_normalized_probs(model(net["src_tokens"], net["src_lengths"], prev), log_probs=True)
    keep = out.ne(task.target_dictionary.pad())
    assert torch.equal(lp.argmax(-1)[keep], out[keep])


def _eos_bias_hook(model, bias):
    eos = model.decoder.dictionary.eos()
    return model.decoder.fc_out.register_forward_hook(
        lambda m, i, out: out.index_add(-1, torch.tensor([eos]), torch.full(out.shape[:-1] + (1,), bias))
    )


@pytest.mark.parametrize("eos_bias", [0.0, 20.0, -20.0])
def test_output_length_equals_input_length(conll, cache, eos_bias):
    """Greedy, beam 3 and sampling (fairseq's SequenceGenerator and our decoder)
    output one label per word, even when the scores push EOS up or down."""
    task, model = build(conll, cache, "--search-algorithm", "fairseq")
    sample = batch(task, n=31)
    src_len = sample["net_input"]["src_lengths"].tolist()  # words + EOS
    handle = _eos_bias_hook(model, eos_bias)
    try:
        runs = {
            "greedy": generate(task, model, sample, beam=1),
            "beam3": generate(task, model, sample, beam=3),
            "sampling": generate(task, model, sample, beam=2, sampling=True),
        }
        torch.manual_seed(0)
        ours = {s: decode_candidates(model, sample, DecodeConfig(strategy=s, num_candidates=n))
                for s, n in (("greedy", 1), ("sample", 3), ("beam", 3))}
    finally:
        handle.remove()
    eos = task.target_dictionary.eos()
    for name, hypos in runs.items():
        for i, nbest in enumerate(hypos):
            for h in nbest:
                assert len(h["tokens"]) == src_len[i], name
                assert int(h["tokens"][-1]) == eos and eos not in h["tokens"][:-1].tolist()
    for name, cand in ours.items():
        expected = torch.tensor(src_len).repeat_interleave(cand.num_per_input)
        assert torch.equal(cand.lengths, expected), name
        assert bool(cand.finished.all())


def test_beam_wider_than_label_set_is_refused(conll, cache):
    """A one-word sentence has only |labels| complete hypotheses; fairseq's beam
    search would fail an assertion, the task says why instead."""
    task, model = build(conll, cache)
    sample = batch(task, n=4)
    num_labels = len(task.target_dictionary) - task.target_dictionary.nspecial
    assert len(generate(task, model, sample, beam=num_labels)) == 4
    with pytest.raises(ValueError, match="larger than the number of labels"):
        generate(task, model, sample, beam=num_labels + 1)


def test_without_forced_length_lengths_differ(conll, cache):
    """The same check fails for a model without the mask (EOS pushed up; fairseq's
    SequenceGenerator, whose length the mask alone fixes)."""
    task, model = build(conll, cache, "--decoder-no-forced-length", "--search-algorithm", "fairseq")
    sample = batch(task, n=31)
    handle = _eos_bias_hook(model, 20.0)
    try:
        hypos = generate(task, model, sample, beam=1)
    finally:
        handle.remove()
    lengths = [len(n[0]["tokens"]) for n in hypos]
    assert lengths != sample["net_input"]["src_lengths"].tolist()


def test_fixed_attention_uses_state_i(conll, cache):
    """Unidirectional encoder: changing word j changes the scores of labels >= j
    only. Either encoder: perturbing encoder state k changes decoder steps >= k only,
    step k included (the decoder reads state t at step t, also for left padding)."""
    pad_src = None
    for extra in (["--encoder-unidirectional"], []):
        task, model = build(conll, cache, *extra)
        sample = batch(task)
        net = sample["net_input"]
        row = int(net["src_lengths"].argmax())
        j = 2
        src2 = net["src_tokens"].clone()
        reuters, the = task.source_dictionary.index("Reuters"), task.source_dictionary.index("the")
        src2[row, j] = the if int(src2[row, j]) == reuters else reuters
        with torch.no_grad():
            a = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])[0][row]
            b = model(src2, net["src_lengths"], net["prev_output_tokens"])[0][row]
        changed = (a - b).abs().nan_to_num(0.0).amax(dim=-1) > 1e-6  # -inf - -inf = nan where masked
        if extra:
            assert not changed[:j].any() and changed[j]
        else:
            assert changed[:j].any(), "a BiLSTM state depends on later words"

        k = 3

        def perturb(module, inputs, out):
            states = out["encoder_out"][0].clone()
            states[:, k] += 1.0
            return {**out, "encoder_out": [states]}

        for src in (net["src_tokens"], utils.convert_padding_direction(net["src_tokens"], 1, right_to_left=True)):
            with torch.no_grad():
                clean = model(src, net["src_lengths"], net["prev_output_tokens"])[0]
                handle = model.encoder.register_forward_hook(perturb)
                try:
                    noisy = model(src, net["src_lengths"], net["prev_output_tokens"])[0]
                finally:
                    handle.remove()
            diff = (clean - noisy).abs().nan_to_num(0.0).amax(dim=-1)[row]
            assert diff[:k].max() == 0 and diff[k] > 0
            pad_src = src
    assert pad_src[:, 0].eq(1).any(), "the last batch checked is left-padded"


# --------------------------------------------------------------------- end to end

# one thread: the models are small, and more threads than free cores only contend
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
TRAIN = ["--user-dir", "fairseq_ext", "--task", "sequence_tagging", "--criterion", "cross_entropy",
         "--optimizer", "adam", "--lr", "0.01", "--no-epoch-checkpoints", "--no-save-optimizer-state",
         "--log-format", "simple", "--num-workers", "0", "--seed", "1"]


def test_cli_train_generate_score(conll, tmp_path):
    cache_dir, save = str(tmp_path / "cache"), str(tmp_path / "ckpt")
    task_args = ["--tagging-column", "ner", "--tagging-cache-dir", cache_dir]
    run_cli(["fairseq-train", conll, *TRAIN, *task_args, "--arch", "tagging_lstm_tiny", "--batch-size", "16",
             "--max-update", "150", "--save-dir", save, "--disable-validation"], env=ONE_THREAD)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    state = checkpoint_utils.load_checkpoint_to_cpu(ckpt)
    assert state["model"]["encoder.embed_tokens.weight"].shape[1] == 16  # the tiny arch's sizes
    gen = run_cli(["fairseq-generate", conll, "--user-dir", "fairseq_ext", "--task", "sequence_tagging",
                   *task_args, "--path", ckpt, "--gen-subset", "test", "--beam", "3", "--batch-size", "8"],
                  env=ONE_THREAD)
    lines = gen.stdout.splitlines()
    hyps = {l.split("\t")[0][2:]: l.split("\t")[2].split() for l in lines if l.startswith("H-")}
    refs = {l.split("\t")[0][2:]: l.split("\t")[1].split() for l in lines if l.startswith("T-")}
    assert len(hyps) == 31, "every test sentence (31 is not a multiple of the batch size)"
    assert all(len(hyps[i]) == len(refs[i]) for i in hyps)
    out_file = tmp_path / "gen.out"
    out_file.write_text(gen.stdout)
    res = run_cli(["python", SCORER, str(out_file)])
    assert "precision" in res.stdout and "PER" in res.stdout
    js = json.loads(run_cli(["python", SCORER, str(out_file), "--json", "-"]).stdout)
    assert js["sentences"] == 31 and js["scheme"] == "chunk"
    assert js["f1"] > 80.0, js


@pytest.mark.parametrize("search", ["greedy", "soft"])
def test_eval_tagging_logs_the_scorers_f1(conll, tmp_path, search):
    """--tagging-eval: the validation f1 / tag_acc that fairseq-train logs (and
    selects checkpoints on) equal score_tagging.py on fairseq-generate's output for
    the same checkpoint and split: greedy, or with --tagging-eval-search soft the
    soft beam (k = 2, alpha 0.3, far from greedy) of --search-algorithm soft."""
    cache_dir, save = str(tmp_path / "cache"), str(tmp_path / "ckpt")
    task_args = ["--tagging-column", "ner", "--tagging-cache-dir", cache_dir]
    beam = ["--search-alpha", "0.3"]
    train_search = [] if search == "greedy" else ["--tagging-eval-search", search, "--tagging-eval-beam", "2"] + beam
    gen_search = ["--beam", "1"] if search == "greedy" else ["--search-algorithm", search, "--beam", "2"] + beam
    train = run_cli(["fairseq-train", conll, *TRAIN, *task_args, "--arch", "tagging_lstm_tiny", "--batch-size", "16",
                     "--max-epoch", "4", "--save-dir", save, "--tagging-eval", "--best-checkpoint-metric", "f1",
                     "--maximize-best-checkpoint-metric", "--log-format", "json", "--no-epoch-checkpoints",
                     *train_search], env=ONE_THREAD)
    valid = [json.loads(l[l.index("{"):]) for l in train.stdout.splitlines() if "| valid |" in l]
    assert len(valid) == 4 and all("valid_f1" in v and "valid_tag_acc" in v for v in valid)
    gen = run_cli(["fairseq-generate", conll, "--user-dir", "fairseq_ext", "--task", "sequence_tagging",
                   *task_args, "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "valid",
                   *gen_search, "--batch-size", "7"], env=ONE_THREAD)
    out_file = tmp_path / "valid.out"
    out_file.write_text(gen.stdout)
    js = json.loads(run_cli(["python", SCORER, str(out_file), "--json", "-"]).stdout)
    assert float(valid[-1]["valid_f1"]) == pytest.approx(js["f1"], abs=0.01)
    assert float(valid[-1]["valid_tag_acc"]) == pytest.approx(js["accuracy"], abs=0.01)
    assert float(valid[-1]["valid_best_f1"]) == max(float(v["valid_f1"]) for v in valid)


@pytest.mark.slow
def test_real_conll2003_ner(real_data, tmp_path):
    """2000 training sentences, 300 updates of tagging_lstm_ner (about 20 s on one
    core), greedy on the test set: F1 (measured 51) well above the all-O tagger (0)."""
    data = os.path.join(real_data, "conll2003")
    cache_dir, save = str(tmp_path / "cache"), str(tmp_path / "ckpt")
    task_args = ["--tagging-column", "ner", "--tagging-cache-dir", cache_dir, "--tagging-max-train-sentences", "2000"]
    run_cli(["fairseq-train", data, *TRAIN, *task_args, "--arch", "tagging_lstm_ner", "--max-tokens", "1000",
             "--max-update", "300", "--save-dir", save, "--disable-validation"], env=ONE_THREAD)
    gen = run_cli(["fairseq-generate", data, "--user-dir", "fairseq_ext", "--task", "sequence_tagging",
                   *task_args, "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
                   "--beam", "1", "--batch-size", "256"], env=ONE_THREAD)
    out_file = tmp_path / "gen.out"
    out_file.write_text(gen.stdout)
    js = json.loads(run_cli(["python", SCORER, str(out_file), "--json", "-"]).stdout)
    assert js["sentences"] == 3453
    assert js["f1"] > 40.0, js
