"""Residual EBM through fairseq on the toy corpus: a tiny base transformer_lm,
scripts/prepare/sample_negatives.py, fairseq-train --task residual_lm --criterion
residual_nce (bit and unit), scripts/score/eval_residual.py, fairseq-generate with the
joint sampler; and the checks that bad input fails before any work."""
import itertools
import json
import math
import os
import re
import shutil

import pytest
import torch

from conftest import assert_shards_make_one_run, run_cli
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.token_costs import unique_ngram_share

P, L = 8, 4
TASK = ["--user-dir", "fairseq_ext", "--task", "residual_lm", "--residual-prefix-len", str(P),
        "--residual-continuation-len", str(L)]


@pytest.fixture(scope="module")
def base_lm(toy_lm_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("base_lm"))
    run_cli(["fairseq-train", toy_lm_bin, "--user-dir", "fairseq_ext", "--task", "language_modeling",
             "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
             "--decoder-output-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
             "--tokens-per-sample", "64", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000",
             "--max-update", "30", "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation",
             "--seed", "1"])
    return os.path.join(save, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def negatives(toy_lm_bin, base_lm, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("negatives"))
    run_cli(["python", "scripts/prepare/sample_negatives.py", toy_lm_bin, "--residual-base-lm", base_lm,
             "--splits", "train,valid,test", "--num-samples", "4", "--out-dir", out] + TASK)
    return out


def train_ebm(data, base_lm, negatives, save, variant, updates):
    return run_cli(["fairseq-train", data, "--residual-base-lm", base_lm, "--residual-negatives-dir", negatives,
                    "--residual-num-negatives", "2",
                    "--arch", "residual_energy", "--energy-variant", variant, "--encoder-layers", "1",
                    "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                    "--criterion", "residual_nce", "--optimizer", "adam", "--lr", "0.003", "--batch-size", "16",
                    "--max-update", str(updates), "--save-dir", save, "--no-epoch-checkpoints", "--log-format",
                    "simple", "--log-interval", "10", "--seed", "1"] + TASK)


@pytest.fixture(scope="module")
def trained_bit(toy_lm_bin, base_lm, negatives, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ebm_bit"))
    out = train_ebm(toy_lm_bin, base_lm, negatives, save, "bit", 200)
    return save, out.stdout + out.stderr


def stats(log, subset):
    return [{k: float(v) for k, v in re.findall(r"\| (\w+) (-?[\d.]+)", line)}
            for line in log.splitlines() if f"| {subset} |" in line]


def test_negatives_file_is_aligned(toy_lm_bin, base_lm, negatives):
    stored = torch.load(os.path.join(negatives, "valid.negatives.pt"), weights_only=True)
    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm)
    blocks = task.load_blocks("valid")
    assert stored["tokens"].shape == (blocks.size(0), 4, L) and stored["prefix_len"] == P
    assert stored["lm_log_prob"].shape == (blocks.size(0), 4)
    # the stored log-probabilities equal fairseq's own LM forward of the stored sequences
    negs = torch.cat([blocks[:, None, :P].expand(-1, 4, -1), stored["tokens"].long()], 2).reshape(-1, P + L)
    assert torch.allclose(stored["lm_log_prob"].double().view(-1), fairseq_lm_log_prob(task.base_lm, negs, P).sum(1),
                          atol=1e-4)
    assert torch.allclose(stored["pos_lm_log_prob"].double(), fairseq_lm_log_prob(task.base_lm, blocks, P).sum(1),
                          atol=1e-4)


def test_nce_training_logs_and_learns(trained_bit):
    """Train and valid metrics are logged every epoch; over 200 updates the energy
    learns to tell the toy corpus from the 30-update base LM's samples on the
    training set: the loss falls below its value at E = 0 (2 log 2 = 1.386 nats),
    the class-balanced accuracy rises above chance and positives get lower
    energies than negatives. (Validation, 24 prefixes, is too small to show it.)"""
    save, log = trained_bit
    assert os.path.exists(os.path.join(save, "checkpoint_best.pt"))
    valid, train = stats(log, "valid"), stats(log, "train")
    assert valid and train, log[-2000:]
    for key in ("loss", "e_pos", "e_neg", "acc_pos", "acc_neg", "acc"):
        assert key in valid[-1] and key in train[-1], (key, valid[-1])
    first, last = train[0], train[-1]
    assert first["loss"] > 1.38 and last["loss"] < 1.35, train
    assert last["acc"] > 0.55 and last["e_pos"] < last["e_neg"], last


def test_unit_variant_trains(toy_lm_bin, base_lm, negatives, tmp_path):
    out = train_ebm(toy_lm_bin, base_lm, negatives, str(tmp_path), "unit", 5)
    assert stats(out.stdout + out.stderr, "valid"), out.stdout[-2000:]


def test_eval_script_perplexity_range(toy_lm_bin, base_lm, negatives, trained_bit, tmp_path):
    save, _ = trained_bit
    out_json, out_samples = tmp_path / "eval.json", tmp_path / "samples.jsonl"
    png = ["--png", str(tmp_path / "fig")]
    run_cli(["python", "scripts/score/eval_residual.py", toy_lm_bin, "--residual-base-lm", base_lm, "--path",
             os.path.join(save, "checkpoint_best.pt"), "--gen-subset", "test", "--num-samples", "16",
             "--range-ns", "2,4,8", "--residual-joint-samples", "8", "--residual-joint-topk", "3",
             "--samples-out", str(out_samples), "--json", str(out_json)] + png + TASK)
    res = json.loads(out_json.read_text())
    from matplotlib.image import imread

    for name in ("ppl_vs_n", "unique_ngrams", "loglik"):  # the figures (matplotlib is in the test extra)
        assert min(imread(str(tmp_path / f"fig_{name}.png")).shape[:2]) > 100
    stored = torch.load(os.path.join(negatives, "test.negatives.pt"), weights_only=True)
    assert res["prefixes"] == stored["tokens"].size(0)
    # the base LM perplexity of the real continuations, scored by fairseq's own LM forward
    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm)
    blocks = task.load_blocks("test")
    real_lp = fairseq_lm_log_prob(task.base_lm, blocks, P).sum(1)
    assert res["base_lm_ppl"] == pytest.approx(torch.exp(-real_lp.sum() / (len(blocks) * L)).item(), rel=1e-4)
    # Figure 2 left: one range per n, the last the main one
    by_n = res["by_num_samples"]
    assert [r["n"] for r in by_n] == [2, 4, 8, 16]
    assert (by_n[-1]["joint_ppl_lower"], by_n[-1]["joint_ppl_upper"]) == (res["joint_ppl_lower"], res["joint_ppl_upper"])
    # Figure 2 right / Figure 3: per prefix the real continuation (scored as sample_negatives scored it), a
    # base-LM and a joint sample of L tokens each; the joint log-likelihood is log P_LM - E - lower log Z
    records = [json.loads(line) for line in out_samples.read_text().splitlines()]
    assert len(records) == len(blocks)
    for r, block, lp in zip(records, blocks, real_lp.tolist()):
        assert r["real"] == task.dictionary.string(block[P:])
        assert r["base_lm_log_prob"][0] == pytest.approx(lp, abs=1e-4)
        assert all(len(r[k].split()) <= L for k in ("base_lm", "joint"))  # <eos> is not printed
    # the joint perplexity range: exp of minus the mean per-token joint log-likelihood of the
    # real continuations, log P_LM - E - log Z, with the lower (upper) log-Z estimate of each prefix
    for key, side in (("joint_ppl_lower", 0), ("joint_ppl_upper", 1)):
        total = sum(r["base_lm_log_prob"][0] - r["energy"][0] - r["log_z"][side] for r in records)
        assert res[key] == pytest.approx(math.exp(-total / (len(records) * L)), rel=1e-4)
    assert set(res["unique_ngram_share"]) == {"real", "base_lm", "joint"}
    real = [b[P:].tolist() for b in blocks]
    assert res["unique_ngram_share"]["real"]["2"]["pooled"] == pytest.approx(unique_ngram_share(real, 2))
    assert res["mean_log_likelihood"]["base_lm"]["real"] == pytest.approx(
        real_lp.mean().item(), abs=1e-4)


def test_generate_joint_sampler(toy_lm_bin, base_lm, trained_bit):
    save, _ = trained_bit
    out = run_cli(["fairseq-generate", toy_lm_bin, "--residual-base-lm", base_lm,
                   "--path", os.path.join(save, "checkpoint_best.pt"), "--gen-subset", "valid", "--batch-size", "8",
                   "--residual-joint-samples", "8", "--residual-joint-topk", "5", "--nbest", "2"] + TASK)
    hyps = [line for line in out.stdout.splitlines() if line.startswith("H-")]
    pos = [line for line in out.stdout.splitlines() if line.startswith("P-")]
    sources = [line for line in out.stdout.splitlines() if line.startswith("S-")]
    assert sources and len(hyps) == 2 * len(sources)
    assert all(len(line.split("\t")[1].split()) == L for line in pos)


def test_joint_sampler_shards_together_equal_one_run(toy_lm_bin, base_lm, trained_bit):
    """--num-shards 2: base-LM samples and resampling draws are seeded per batch from
    its prefix ids, so the shards print exactly the whole run's joint samples."""
    save, _ = trained_bit
    whole = assert_shards_make_one_run(
        ["fairseq-generate", toy_lm_bin, "--residual-base-lm", base_lm, "--path", os.path.join(save,
                                                                                               "checkpoint_best.pt"),
         "--gen-subset", "valid", "--batch-size", "5", "--residual-joint-samples", "6", "--nbest", "2"] + TASK)
    assert len(whole) > 5 and all(len(h) == 2 for h in whole.values())


# ----------------------------------------------------------- in process: bad input, pieces


def setup(data, *extra):
    from fairseq import options, tasks

    import fairseq_ext  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data, "--arch", "residual_energy", "--criterion", "residual_nce"]
                                       + TASK[2:] + list(extra))
    return tasks.setup_task(args), args


def test_missing_base_lm_fails_naming_the_option(toy_lm_bin, tmp_path):
    with pytest.raises(ConfigError, match="--residual-base-lm"):
        setup(toy_lm_bin)
    with pytest.raises(ConfigError, match="--residual-base-lm: no such checkpoint file"):
        setup(toy_lm_bin, "--residual-base-lm", str(tmp_path / "nope.pt"))


def test_encoder_decoder_checkpoint_is_refused(toy_lm_bin, base_lm, tmp_path):
    state = torch.load(base_lm, weights_only=False)
    state["model"]["encoder.embed_tokens.weight"] = state["model"]["decoder.embed_tokens.weight"]
    torch.save(state, tmp_path / "seq2seq.pt")
    with pytest.raises(ValueError, match="not a decoder-only transformer_lm"):
        setup(toy_lm_bin, "--residual-base-lm", str(tmp_path / "seq2seq.pt"))


def test_mismatched_dictionary_fails(toy_lm_bin, base_lm, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(toy_lm_bin, data)
    with open(data / "dict.txt", "a") as f:
        f.write("extraword 1\n")
    with pytest.raises(ValueError, match="vocabulary has .* entries but the data dictionary has"):
        setup(str(data), "--residual-base-lm", base_lm)
    # same size, different words: caught against the base LM's own data dict.txt
    lines = (tmp_path / "data" / "dict.txt").read_text().splitlines()[:-1]
    lines[0] = "zzzz " + lines[0].split()[1]
    (data / "dict.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="differs from the data dictionary"):
        setup(str(data), "--residual-base-lm", base_lm)


def test_negatives_checked_against_the_blocks(toy_lm_bin, base_lm, negatives):
    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm, "--residual-negatives-dir", negatives,
                    "--residual-prefix-len", "6")
    with pytest.raises(ValueError, match="sample_negatives.py"):
        task.load_dataset("valid")


def test_criterion_without_negatives_says_what_to_run(toy_lm_bin, base_lm, tmp_path):
    """residual_nce makes the task refuse a split without negatives, loaded before or after it is built."""
    from fairseq_ext.criterions.residual_nce import ResidualNCECriterion

    task, args = setup(toy_lm_bin, "--residual-base-lm", base_lm, "--residual-negatives-dir", str(tmp_path))
    task.load_dataset("valid")
    with pytest.raises(ConfigError, match=r"--criterion residual_nce needs the negatives of split valid, .*"
                                          r"valid.negatives.pt: run scripts/prepare/sample_negatives.py"):
        ResidualNCECriterion(task)
    task, args = setup(toy_lm_bin, "--residual-base-lm", base_lm, "--residual-negatives-dir", str(tmp_path))
    ResidualNCECriterion(task)
    with pytest.raises(ConfigError, match="needs the negatives of split train"):
        task.load_dataset("train")


def test_unit_starts_from_the_base_lm(toy_lm_bin, base_lm):
    task, args = setup(toy_lm_bin, "--residual-base-lm", base_lm, "--energy-variant", "unit")
    model = task.build_model(args)
    base = task.base_lm.decoder.state_dict()
    for name, value in model.body.state_dict().items():
        assert torch.equal(value, base[name]), name
    assert not any(p.requires_grad for p in task.base_lm.parameters())
    # every trainable tensor gets a gradient from the energy (c10d DDP needs that); the base LM's
    # output projection (untied here) is the one frozen tensor
    model(torch.randint(4, len(task.source_dictionary), (3, P + L))).sum().backward()
    untrained = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert not untrained and frozen == ["body.output_projection.weight"]


def test_joint_sampler_follows_the_energy(toy_lm_bin, base_lm):
    """An energy of 0 for continuations starting with one of three words and 50
    otherwise: Algorithm 1 returns such a continuation whenever one is among the n
    samples of its prefix (exp(-50) ~ 2e-22), and only ever one of its proposals."""
    from fairseq_ext.generators.joint_sampler import JointSampler, sample_continuations

    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    batch = ds.collater([ds[i] for i in range(6)])
    g = torch.Generator().manual_seed(0)
    probe = sample_continuations(task.base_lm, batch["net_input"]["src_tokens"], L, 8, generator=g)
    values, counts = probe[:, :, 0].flatten().unique(return_counts=True)
    words = values[counts.argsort(descending=True)[:3]]  # the 3 most frequent first words

    seen = []

    def energy(seqs):
        seen.append(seqs)
        return torch.where(torch.isin(seqs[:, P], words), 0.0, 50.0)

    n = 16
    sampler = JointSampler(task.base_lm, L, n, num_outputs=3, energy_batch_size=20,
                           generator=torch.Generator().manual_seed(1))
    hypos = sampler.generate([energy], batch)
    assert len(hypos) == 6 and all(len(h) == 3 for h in hypos)
    assert all(h["tokens"].numel() == L and h["positional_scores"].numel() == L for hs in hypos for h in hs)
    proposals = torch.cat(seen).view(6, n, P + L)  # energies came in batches of 20 rows
    assert torch.equal(proposals[:, :, :P], batch["net_input"]["src_tokens"][:, None].expand(-1, n, -1))
    has_word = torch.isin(proposals[:, :, P], words).any(1)
    assert has_word.sum() >= 4  # the test means something
    for b, hs in enumerate(hypos):
        if has_word[b]:
            assert all(int(h["tokens"][0]) in words.tolist() for h in hs)
        for h in hs:  # every output is one of that prefix's proposals
            assert (proposals[b, :, P:] == h["tokens"]).all(1).any()


def test_base_lm_scoring_and_top1_sampling(toy_lm_bin, base_lm):
    """lm_log_prob equals the log-probabilities of a plain full forward of the LM (over
    the stream's symbols), and top-1 sampling equals greedy decoding with that forward
    (<pad> and <s> never chosen)."""
    from fairseq_ext.generators.joint_sampler import lm_log_prob, sample_continuations

    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm)
    lm, d = task.base_lm, task.dictionary
    x = task.load_blocks("valid")[:5]
    assert torch.allclose(lm_log_prob(lm, x, P).double(), fairseq_lm_log_prob(lm, x, P), atol=1e-5)
    hist = torch.cat([torch.full((5, 1), d.eos()), x[:, :P]], 1)
    for _ in range(L):
        logits = lm(hist)[0][:, -1]
        logits[:, [d.pad(), d.bos()]] = float("-inf")
        hist = torch.cat([hist, logits.argmax(-1, keepdim=True)], 1)
    top1 = sample_continuations(lm, x[:, :P], L, 2, topk=1)
    assert torch.equal(top1[:, 0], hist[:, -L:]) and torch.equal(top1[:, 1], hist[:, -L:])


def test_negatives_sampled_with_topk_are_refused(toy_lm_bin, base_lm, negatives, tmp_path):
    """NCE needs P_LM itself as its noise: negatives drawn with --topk > 0 stop before
    training with one line naming the option, unless --residual-allow-topk-negatives."""
    stored = torch.load(os.path.join(negatives, "valid.negatives.pt"), weights_only=True)
    stored["topk"] = 5
    torch.save(stored, tmp_path / "valid.negatives.pt")
    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm, "--residual-negatives-dir", str(tmp_path))
    with pytest.raises(ConfigError, match="sampled with --topk 5.*--residual-allow-topk-negatives"):
        task.load_dataset("valid")
    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm, "--residual-negatives-dir", str(tmp_path),
                    "--residual-allow-topk-negatives")
    task.load_dataset("valid")
    assert "negatives" in task.dataset("valid")[0]


def fairseq_lm_log_prob(lm, seqs, prefix_len):
    """Per-token log P_LM of the continuations of (N, T) sequences from fairseq's own
    forward of the whole sequence (<eos> as BOS), not joint_sampler.lm_log_prob, over
    the stream's symbols (<pad> and <s> never occur in a stream: their probability is
    given to the others in proportion): (N, T - prefix_len) float64."""
    d = lm.decoder.dictionary
    inputs = torch.cat([torch.full((seqs.size(0), 1), d.eos()), seqs[:, :-1]], 1)
    with torch.no_grad():
        probs = lm.get_normalized_probs(lm(inputs), log_probs=False).double()  # (N, T, V)
    probs[..., [d.pad(), d.bos()]] = 0
    probs = probs / probs.sum(-1, keepdim=True)
    return probs[:, prefix_len:].gather(2, seqs[:, prefix_len:, None]).squeeze(2).log()


def test_sampler_draws_the_law_the_scorer_enumerates(tmp_path):
    """A random transformer_lm over 8 symbols (<s>, <pad>, </s>, <unk>, three words and the
    dictionary's filler) that puts mass on every symbol, <pad> and <s> included. After a
    2-word prefix, every 3-token continuation is scored with fairseq's own full forward
    (fairseq_lm_log_prob): the stream's law, a distribution over the 6^3 continuations
    without <pad> and <s> (it sums to 1), is what lm_log_prob gives; 100,000 draws of
    sample_continuations (fairseq's incremental decoding) fit it: chi-square below the
    p = 0.001 critical value over the 216 cells (Wilson-Hilferty), every per-position
    marginal within 4.5 standard errors. Sampling and scoring the LM's own softmax, <pad>
    and <s> kept (they have 0.17 and 0.10 of the mass at the first position), fails: the
    scorer's law is then not this one, and the sampler draws them; once in a history, fairseq's
    incremental decoding (no mask on an earlier <pad>, positions counted over it) and its
    full forward (both) are two different laws."""
    from fairseq_ext.generators.joint_sampler import lm_log_prob, sample_continuations
    from fairseq_ext.synthetic import tiny_models, toy

    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        (raw / f"{split}.txt").write_text("a b c\nc b a\n")
    _, lm, _ = tiny_models.build_task_and_model(toy.binarize_lines(str(raw), str(tmp_path / "bin")),
                                                "language_modeling", "transformer_lm", seed=3)
    lm.eval()
    d = lm.decoder.dictionary
    V, T = len(d), 3
    prefix = torch.tensor([[d.index("a"), d.index("c")]])
    with torch.no_grad():
        first = lm.get_normalized_probs(lm(torch.cat([torch.tensor([[d.eos()]]), prefix], 1)), log_probs=False)
    assert first[0, -1, d.pad()] > 0.05 and first[0, -1, d.bos()] > 0.05
    symbols = [i for i in range(V) if i not in (d.pad(), d.bos())]
    conts = torch.tensor(list(itertools.product(symbols, repeat=T)))
    seqs = torch.cat([prefix.expand(len(conts), -1), conts], 1)
    law = fairseq_lm_log_prob(lm, seqs, prefix.size(1)).sum(1).exp()
    assert law.sum().item() == pytest.approx(1, abs=1e-9)
    assert torch.allclose(lm_log_prob(lm, seqs, prefix.size(1)).double().sum(1).exp(), law, atol=1e-5)

    n = 100_000
    draws = sample_continuations(lm, prefix, T, n, generator=torch.Generator().manual_seed(0))[0]  # (n, T)
    assert not torch.isin(draws, torch.tensor([d.pad(), d.bos()])).any()
    cell = {tuple(c): i for i, c in enumerate(conts.tolist())}
    counts = torch.bincount(torch.tensor([cell[tuple(x)] for x in draws.tolist()]), minlength=len(conts)).double()
    expected = n * law
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    df = len(conts) - 1
    critical = df * (1 - 2 / (9 * df) + 3.0902 * math.sqrt(2 / (9 * df))) ** 3  # chi-square quantile 0.999
    assert chi2 < critical, (chi2, critical)
    for t in range(T):
        for s in symbols:
            p = law[conts[:, t] == s].sum().item()
            share = (draws[:, t] == s).double().mean().item()
            assert abs(share - p) < 4.5 * math.sqrt(p * (1 - p) / n), (t, d[s], share, p)


def test_log_z_estimates_from_the_base_lm_match_the_enumerated_log_z(toy_lm_bin, base_lm):
    """Continuations of 2 tokens after one real prefix: all V^2 of them are
    enumerated with fairseq's own LM forward (not our sampler's scoring), giving the
    exact log Z = log sum_x P_LM(x) exp(-E(x)) for a fixed energy table with a spread
    of a few nats, and the exact 1/n bias of the estimators (Theorem 2:
    E[T_n] = log Z - c/n + o(1/n), E[upper] = log Z + c/n + o(1/n), c = Var(w) / (2
    E[w]^2), w = exp(-E)). 300 sets of n = 32 samples drawn by the joint sampler's
    proposal step (what eval_residual.py uses) give lower and upper means within 4
    standard errors (+ 0.3 c/n for the o(1/n) terms) of those expectations. Samples
    from another distribution miss: top-5 sampling is 0.11 nats off against a
    tolerance of 0.06 (top-20 passes: this 30-update LM puts nearly all its mass
    there)."""
    from fairseq_ext.core.residual_ebm import log_z_estimates
    from fairseq_ext.generators.joint_sampler import JointSampler

    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm)
    lm = task.base_lm
    V = len(task.dictionary)
    task.load_dataset("valid")
    prefix = task.dataset("valid")[0]["positive"][:P]
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def energy(seqs):
        return table[seqs[:, P], seqs[:, P + 1]].float()

    conts = torch.cartesian_prod(torch.arange(V), torch.arange(V))  # (V^2, 2)
    seqs = torch.cat([prefix.expand(V * V, -1), conts], 1)
    log_p = fairseq_lm_log_prob(lm, seqs, P).sum(1)
    assert torch.logsumexp(log_p, 0).item() == pytest.approx(0.0, abs=1e-4)  # every continuation enumerated
    e = energy(seqs).double()
    log_z = torch.logsumexp(log_p - e, 0).item()
    w, p = torch.exp(-e), log_p.exp()
    c = ((p * (w - (p * w).sum()) ** 2).sum() / (2 * (p * w).sum() ** 2)).item()
    n, sets = 32, 300
    assert c / n > 0.005  # the bias is visible at this n
    sampler = JointSampler(lm, 2, n, generator=torch.Generator().manual_seed(1))
    _, energies = sampler.propose(energy, prefix.expand(sets, -1))
    lower, upper = log_z_estimates(energies.double())
    for est, expected in ((lower, log_z - c / n), (upper, log_z + c / n)):
        se = est.std().item() / sets ** 0.5
        assert abs(est.mean().item() - expected) < 4 * se + 0.3 * c / n, (est.mean().item(), expected, se, c / n)


def test_residual_table_gain_and_accuracy_by_hand(tmp_path):
    """examples/residual_ebm/table.py on hand-made files: the gain of the real continuation
    (joint - base-LM log-likelihood) per prefix is 1, 2, 3 -> mean 2, s.e. 1 / sqrt(3), t = 3.46;
    the best valid accuracy 0.61 at epoch 2 of 3; perplexities averaged over two seeds."""
    def write_eval(seed, base_ppl, lo, hi, gains):
        res = {"prefixes": 3, "tokens": 12, "num_samples": 4, "base_lm_ppl": base_ppl,
               "joint_ppl_lower": lo, "joint_ppl_upper": hi,
               "by_num_samples": [{"n": 4, "joint_ppl_lower": lo, "joint_ppl_upper": hi}],
               "unique_ngram_share": {n: {"2": {"pooled": 0.5, "per_sequence": 1.0}}
                                      for n in ("real", "base_lm", "joint")},
               "mean_log_likelihood": {s: {n: -10.0 for n in ("real", "base_lm", "joint")}
                                       for s in ("base_lm", "joint")}}
        (tmp_path / f"eval_bit.s{seed}_k0.json").write_text(json.dumps(res))
        with open(tmp_path / f"eval_bit.s{seed}_k0.samples.jsonl", "w") as f:
            for g in gains:
                f.write(json.dumps({"joint_log_prob": [-20.0 + g, 0, 0], "base_lm_log_prob": [-20.0, 0, 0]}) + "\n")
        with open(tmp_path / f"bit.s{seed}.log", "w") as f:
            for epoch, acc in ((1, 0.55), (2, 0.61), (3, 0.60)):
                f.write("2026-11-25 | INFO | valid | " + json.dumps({"epoch": epoch, "valid_acc": str(acc)}) + "\n")

    write_eval(1, 100.0, 90.0, 92.0, [1.0, 2.0, 3.0])
    write_eval(2, 100.0, 94.0, 96.0, [1.0, 2.0, 3.0])
    out = run_cli(["python", "examples/residual_ebm/table.py", str(tmp_path), "--seeds", "1", "2", "--variants", "bit"]).stdout
    row = next(line for line in out.splitlines() if line.startswith("| joint bit"))
    assert "[92.000 +- 2.828, 94.000 +- 2.828]" in row
    assert "+2.000 +- 0.577 (+3.5)" in row
    assert "0.610 (2 of 3)" in row


def test_rerank_residual_orders_by_lm_log_prob_minus_energy(toy_lm_bin, base_lm, trained_bit, tmp_path):
    """python -m fairseq_ext.rerank_residual on a user's candidates (JSONL, and the same as
    fairseq-generate H- lines): each candidate's lm_log_prob is the base LM's full forward
    (fairseq_lm_log_prob, not joint_sampler's scorer), its energy the energy model's on the
    prefix + candidate alone, score their difference, candidates best first; a candidate of
    another length than the trained one is scored with a warning."""
    from fairseq import checkpoint_utils

    save, _ = trained_bit
    ebm = os.path.join(save, "checkpoint_best.pt")
    task, _ = setup(toy_lm_bin, "--residual-base-lm", base_lm)
    d, lm = task.dictionary, task.base_lm
    blocks = task.load_blocks("valid")[:6]
    text = lambda t: " ".join(d[int(i)] for i in t)  # noqa: E731
    prompts = [{"id": i, "prefix": text(blocks[i, :P]),
                "candidates": [text(blocks[j, P:]) for j in (i, i + 1, i + 2)] + [text(blocks[i, P:P + L - 1])]}
               for i in range(3)]
    (tmp_path / "cands.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    (tmp_path / "nbest.out").write_text("".join(f"S-{p['id']}\t{p['prefix']}\n" + "".join(
        f"H-{p['id']}\t-1.0\t{p['prefix']} {c}\n" for c in p["candidates"]) for p in prompts))
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [ebm], arg_overrides={"data": toy_lm_bin, "residual_base_lm": base_lm})
    energy_model = models[0].eval()
    outputs = []
    for name in ("cands.jsonl", "nbest.out"):
        proc = run_cli(["python", "-m", "fairseq_ext.rerank_residual", "--energy", ebm, "--base-lm", base_lm,
                        "--data", toy_lm_bin, "--candidates", str(tmp_path / name), "--output",
                        str(tmp_path / f"{name}.reranked")])
        assert proc.stdout.strip().startswith("rerank_residual: 3 prompts, 12 candidates;"), proc.stdout
        assert "3 candidates are not 4 tokens long" in proc.stderr
        outputs.append([json.loads(line) for line in (tmp_path / f"{name}.reranked").read_text().splitlines()])
    assert outputs[0] == outputs[1]
    for prompt, got in zip(prompts, outputs[0]):
        assert got["id"] == prompt["id"] and got["prefix"] == prompt["prefix"]
        assert sorted(c["text"] for c in got["candidates"]) == sorted(prompt["candidates"])
        for c in got["candidates"]:
            seq = d.encode_line(prompt["prefix"] + " " + c["text"], add_if_not_exist=False, append_eos=False).long()
            lp = float(fairseq_lm_log_prob(lm, seq[None], P).sum())
            with torch.no_grad():
                energy = float(energy_model(seq[None]))
            assert c["lm_log_prob"] == pytest.approx(lp, abs=1e-4)
            assert c["energy"] == pytest.approx(energy, abs=1e-4)
            assert c["score"] == pytest.approx(lp - energy, abs=1e-4)
        scores = [c["score"] for c in got["candidates"]]
        assert scores == sorted(scores, reverse=True)


def test_rerank_residual_bad_input_is_one_line(toy_lm_bin, base_lm, trained_bit, tmp_path):
    import subprocess

    from conftest import REPO, cli_env

    save, _ = trained_bit
    ebm = os.path.join(save, "checkpoint_best.pt")
    (tmp_path / "bad.jsonl").write_text('{"prefix": "a b"}\n')
    base = ["python", "-m", "fairseq_ext.rerank_residual", "--base-lm", base_lm, "--data", toy_lm_bin,
            "--output", str(tmp_path / "out.jsonl")]
    for args, message in [(["--energy", "nope.pt", "--candidates", str(tmp_path / "bad.jsonl")],
                           "--energy nope.pt: no such file"),
                          (["--energy", ebm, "--candidates", str(tmp_path / "bad.jsonl")],
                           "line 1 has no 'prefix' or no 'candidates'"),
                          (["--energy", base_lm, "--candidates", str(tmp_path / "bad.jsonl")],
                           "not a residual EBM")]:
        proc = subprocess.run(base + args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
        assert not (tmp_path / "out.jsonl").exists()
