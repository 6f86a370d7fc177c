"""The Metropolis-Hastings sampler on a real fairseq ``cmlm_transformer``: batched
energies equal fairseq's own decoder run one masked position at a time, and
``fairseq-generate --task translation_mh`` end to end (chains, statistics file,
degenerate Gibbs, reproducibility, bad options)."""
import itertools
import json
import math
import os
import re

import pytest
import torch

from conftest import REPO, assert_shards_make_one_run, run_cli
from fairseq_ext.synthetic import tiny_models
from fairseq_ext.core import mcmc
from fairseq_ext.generators.mh_sampler import MHSampler, check_cmlm, cmlm_logits_fn, forbidden_symbols

USER_DIR = os.path.join(REPO, "fairseq_ext")
TINY = tiny_models.TINY_ARCHS["cmlm_transformer"]


@pytest.fixture(scope="module")
def cmlm(toy_bin, tmp_path_factory):
    """A tiny CMLM trained for 25 epochs on the toy corpus through fairseq-train
    --task translation_mh (the task trains exactly as translation_lev)."""
    save = str(tmp_path_factory.mktemp("cmlm"))
    run_cli(["fairseq-train", toy_bin, "--user-dir", USER_DIR, "--task", "translation_mh", *TINY,
             "--criterion", "nat_loss", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "500",
             "--max-epoch", "25", "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0",
             "--seed", "1"])
    return os.path.join(save, "checkpoint_last.pt")


def generate(toy_bin, cmlm, *extra):
    proc = run_cli(["fairseq-generate", toy_bin, "--user-dir", USER_DIR, "--task", "translation_mh",
                    "--path", cmlm, "--gen-subset", "valid", "--batch-size", "12", "--seed", "3", *extra])
    return proc.stdout


def lines(out, tag):
    return [line.split("\t") for line in out.splitlines() if line.startswith(tag + "-")]


def test_generate_with_post_processing_runs_every_batch(toy_bin, cmlm):
    # --post-process makes fairseq-generate add the detokenized words it prints to the
    # target dictionary; the sampler must keep the model's vocabulary (4 batches of 12)
    out = generate(toy_bin, cmlm, "--post-process", "sentencepiece", "--mh-burn-in", "1", "--mh-epochs", "1")
    assert len(lines(out, "H")) == 40


def test_batched_energies_equal_one_decoder_pass_per_masked_position(toy_bin, cmlm):
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401  (registers translation_mh, patches checkpoint loading)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([cmlm])
    model = models[0].eval()
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    src = sample["net_input"]["src_tokens"]
    sampler = MHSampler([model], task.target_dictionary, mcmc.MHConfig(), chains=2)
    with torch.no_grad():
        enc = model.forward_encoder([src, sample["net_input"]["src_lengths"]])
        tokens, free, owner = sampler.initial_states(model, enc, src, forbidden_symbols(task.target_dictionary))
        e_raw, e_local = mcmc.energies(cmlm_logits_fn(model, enc), tokens, free, owner, sampler.mask, max_rows=5)
        assert tokens.ne(task.target_dictionary.pad()).sum(1).min() < tokens.size(1)  # padding present
        unk = task.target_dictionary.unk()
        for r in range(tokens.size(0)):
            n = int(tokens[r].ne(task.target_dictionary.pad()).sum())
            raw = local = 0.0
            for t in free[r].nonzero().flatten().tolist():
                masked = tokens[r, :n].clone()
                masked[t] = unk
                logits = model.decoder(normalize=False, prev_output_tokens=masked[None],
                                       encoder_out=model.encoder.reorder_encoder_out(enc, owner[r:r + 1]))[0, t]
                raw -= logits[tokens[r, t]].item()
                local -= torch.log_softmax(logits, -1)[tokens[r, t]].item()
            assert e_raw[r].item() == pytest.approx(raw, abs=1e-3)
            assert e_local[r].item() == pytest.approx(local, abs=1e-3)


def test_generate_prints_one_hypothesis_per_chain_and_writes_statistics(toy_bin, cmlm, tmp_path):
    stats = tmp_path / "stats.jsonl"
    out = generate(toy_bin, cmlm, "--mh-chains", "2", "--nbest", "2", "--mh-burn-in", "1", "--mh-epochs", "2",
                   "--mh-energy", "local", "--mh-stats-file", str(stats), "--mh-history")
    hyps, pos = lines(out, "H"), lines(out, "P")
    assert len(hyps) == 2 * 40 and len(pos) == 2 * 40
    records = {r["id"]: r for r in map(json.loads, stats.read_text().splitlines())}
    assert len(records) == 40
    for rec in records.values():
        assert len(rec["epochs"]) == 3
        for ep in rec["epochs"]:
            assert ep["proposals"] == [rec["length"]] * 2  # block size 1: every position once
            assert all(n <= a <= p for n, a, p in zip(ep["novel"], ep["accepted"], ep["proposals"]))
    # the printed hypothesis is the final state; its P- scores (in bits) sum to -E_local
    # and the statistics hold its energies, all against fairseq's decoder run one masked
    # position at a time (enumerated_energies, not core.mcmc)
    by_id = {}
    for (h, p) in zip(hyps, pos):
        by_id.setdefault(int(h[0][2:]), []).append((h[2], [float(x) for x in p[1].split()]))
    model, task = load_cmlm(cmlm)
    for sid in sorted(by_id)[:6]:
        last = records[sid]["epochs"][-1]
        for c, (text, scores) in enumerate(by_id[sid]):
            assert text == last["hyps"][c]
            e_raw, e_local = energies_of_printed(model, task, sid, text)
            assert -sum(scores) * math.log(2) == pytest.approx(e_local, abs=0.01)
            assert last["e_local"][c] == pytest.approx(e_local, abs=1e-3)
            assert last["e_raw"][c] == pytest.approx(e_raw, abs=1e-3)
    # scripts/plot/plot_mh.py: per-epoch curves pooled over sentences and chains, one figure per curve
    run_cli(["python", "scripts/plot/plot_mh.py", str(stats), "--labels", "run", "--json", str(tmp_path / "mh.json"),
             "--png", str(tmp_path / "mh")])
    curves = json.loads((tmp_path / "mh.json").read_text())["run"]["curves"]
    for e in range(3):
        eps = [rec["epochs"][e] for rec in records.values()]
        assert curves["accept"][e] == pytest.approx(sum(sum(x["accepted"]) for x in eps)
                                                     / sum(sum(x["proposals"]) for x in eps))
    assert len(curves["bleu"]) == 3
    from matplotlib.image import imread

    for key in ("accept", "novel", "e_local", "e_raw", "bleu"):
        assert imread(str(tmp_path / f"mh_{key}.png")).shape[:2] == (385, 550)  # 5 x 3.5 inches at 110 dpi


def test_annealed_run_prints_each_chain_lowest_energy_state(toy_bin, cmlm, tmp_path):
    """--mh-anneal-floor-at 0.5 over 1 + 4 epochs: temperatures 1, 0.525, 0.05, 0.05,
    0.05 (floor 0.05 at epoch round(0.5 * 4) = 2). --mh-output best prints each chain's
    lowest-energy visited state; its raw energy from fairseq's decoder is the reported
    one, and no end-of-epoch state of the chain had a lower energy."""
    stats = tmp_path / "best.jsonl"
    out = generate(toy_bin, cmlm, "--mh-burn-in", "1", "--mh-epochs", "4", "--mh-anneal-floor-at", "0.5",
                   "--mh-output", "best", "--mh-stats-file", str(stats), "--mh-history")
    records = {r["id"]: r for r in map(json.loads, stats.read_text().splitlines())}
    model, task = load_cmlm(cmlm)
    hyps = {int(h[0][2:]): h[2] for h in lines(out, "H")}
    for sid in sorted(hyps)[:6]:
        rec = records[sid]
        assert [ep["target_temperature"] for ep in rec["epochs"]] == pytest.approx([1, 0.525, 0.05, 0.05, 0.05])
        assert hyps[sid] == rec["best_hyps"][0]
        e_raw, _ = energies_of_printed(model, task, sid, hyps[sid])
        assert rec["best_energy"][0] == pytest.approx(e_raw, abs=1e-3)
        assert rec["best_energy"][0] <= min(ep["e_raw"][0] for ep in rec["epochs"]) + 1e-4


def test_with_best_output_the_lowest_energy_chain_is_printed_first(toy_bin, cmlm, tmp_path):
    """--mh-output best with 4 chains from random states: each sentence's hypotheses come in
    order of raw energy (recomputed from fairseq's decoder), so --nbest 1 (the translate
    preset's output) prints the best of the chains, not chain 0; the first one's energy is the
    lowest of the chains' best states in the statistics file."""
    stats = tmp_path / "chains.jsonl"
    out = generate(toy_bin, cmlm, "--mh-chains", "4", "--mh-init", "random", "--mh-proposal-temperature", "2",
                   "--mh-burn-in", "0", "--mh-epochs", "1", "--mh-output", "best", "--nbest", "4",
                   "--mh-stats-file", str(stats))
    records = {r["id"]: r for r in map(json.loads, stats.read_text().splitlines())}
    model, task = load_cmlm(cmlm)
    by_id = {}
    for h in lines(out, "H"):
        by_id.setdefault(int(h[0][2:]), []).append(h[2])
    not_chain_0 = 0
    for sid in sorted(by_id)[:8]:
        energies = [energies_of_printed(model, task, sid, text)[0] for text in by_id[sid]]
        assert energies == sorted(energies) or all(b - a > -1e-3 for a, b in zip(energies, energies[1:])), energies
        assert energies[0] == pytest.approx(min(records[sid]["best_energy"]), abs=1e-3)
        not_chain_0 += min(records[sid]["best_energy"]) < records[sid]["best_energy"][0] - 1e-3
    assert not_chain_0 > 0, "random starts: some sentence's best chain should not be chain 0"


def test_gibbs_runs_and_mh_runs_are_reproducible(toy_bin, cmlm, tmp_path):
    stats = tmp_path / "gibbs.jsonl"
    generate(toy_bin, cmlm, "--mh-kernel", "gibbs", "--mh-block-size", "2", "--mh-burn-in", "0", "--mh-epochs", "2",
             "--mh-stats-file", str(stats))
    assert len(stats.read_text().splitlines()) == 40
    args = ("--mh-burn-in", "1", "--mh-epochs", "1", "--mh-block-size", "2", "--mh-anneal-block", "--mh-top-p", "0.9")
    a, b = generate(toy_bin, cmlm, *args), generate(toy_bin, cmlm, *args)
    assert lines(a, "H") == lines(b, "H") and len(lines(a, "H")) == 40


def test_shards_together_equal_one_run(toy_bin, cmlm):
    """--num-shards 2 --shard-id i: random initial states and MH draws are seeded per
    batch from its sentence ids, so the two shards print exactly the whole run's chains."""
    whole = assert_shards_make_one_run(
        ["fairseq-generate", toy_bin, "--user-dir", USER_DIR, "--task", "translation_mh", "--path", cmlm,
         "--gen-subset", "valid", "--batch-size", "6", "--seed", "3", "--mh-init", "random", "--mh-chains", "2",
         "--mh-burn-in", "1", "--mh-epochs", "1", "--mh-proposal-temperature", "2", "--nbest", "2"])
    assert len(whole) == 40 and all(len(h) == 2 for h in whole.values())
    assert any(h[0] != h[1] for h in whole.values()), "the chains should differ (random draws)"


def test_bad_options_fail_before_any_work(toy_bin, cmlm):
    with pytest.raises(AssertionError, match="--mh-block-size must be >= 1, got 0"):
        generate(toy_bin, cmlm, "--mh-block-size", "0")


def test_non_cmlm_models_are_refused(untrained_models):
    with pytest.raises(ValueError, match="not a conditional masked LM"):
        check_cmlm(untrained_models["transformer"][1])


def load_cmlm(cmlm):
    """The trained CMLM (eval mode) and its task with the valid set loaded."""
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401  (registers translation_mh, patches checkpoint loading)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([cmlm])
    task.load_dataset("valid")
    return models[0].eval(), task


def energies_of_printed(model, task, sid, text):
    """E_raw and E_local of a printed hypothesis of valid sentence ``sid``, from
    :func:`enumerated_energies`."""
    d = task.target_dictionary
    ds = task.dataset("valid")
    sample = ds.collater([ds[sid]])
    tokens = torch.cat([torch.tensor([d.bos()]), d.encode_line(text, add_if_not_exist=False).long()])[None]
    with torch.no_grad():
        enc = model.forward_encoder([sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]])
        raw, local = enumerated_energies(model, enc, tokens, range(1, tokens.size(1) - 1))
    return raw.item(), local.item()


def enumerated_energies(model, enc, seqs, free_positions):
    """E_raw and E_local of every row of ``seqs`` (N, L) from fairseq's own decoder,
    one forward per masked position (not core.mcmc): two (N,) float64."""
    raw = torch.zeros(len(seqs), dtype=torch.double)
    local = torch.zeros(len(seqs), dtype=torch.double)
    for t in free_positions:
        masked = seqs.clone()
        masked[:, t] = model.decoder.dictionary.unk()
        enc_n = model.encoder.reorder_encoder_out(enc, torch.zeros(len(seqs), dtype=torch.long))
        logits = model.decoder(normalize=False, prev_output_tokens=masked, encoder_out=enc_n)[:, t].double()
        raw -= logits.gather(1, seqs[:, t:t + 1]).squeeze(1)
        local -= torch.log_softmax(logits, -1).gather(1, seqs[:, t:t + 1]).squeeze(1)
    return raw, local


@pytest.mark.parametrize("energy,block,top_p", [("raw", 1, 1.0), ("local", 2, 1.0), ("raw", 1, 0.8)])
def test_mh_through_a_cmlm_samples_the_enumerated_target(toy_bin, cmlm, energy, block, top_p):
    """A real cmlm_transformer, one source sentence, targets of length 4 over 3 allowed
    symbols (81 sequences; every other symbol forbidden to the proposal): the target
    p(y) ~ exp(-E(y) / T) is enumerated with fairseq's decoder, one masked forward per
    position. 2000 chains from one state, 12 epochs: the chains' states are as close
    to p as 2000 iid draws from p are (single-site, block and nucleus-mixture
    proposals); the degenerate Gibbs sampler with the same proposals is not."""
    model, task = load_cmlm(cmlm)
    d = task.target_dictionary
    ds = task.dataset("valid")
    sample = ds.collater([ds[0]])
    symbols = [d.nspecial + i for i in range(3)]
    body = torch.tensor(list(itertools.product(symbols, repeat=4)))
    seqs = torch.cat([torch.full((81, 1), d.bos()), body, torch.full((81, 1), d.eos())], 1)
    T = 3.0  # flattens p so that several states carry mass
    with torch.no_grad():
        enc = model.forward_encoder([sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]])
        e_raw, e_local = enumerated_energies(model, enc, seqs, range(1, 5))
        p = torch.softmax(-(e_raw if energy == "raw" else e_local) / T, 0)
        assert p.max() < 0.5 and (p > 0.01).sum() >= 10, p.sort(descending=True).values[:10]
        chains = 2000
        forbidden = torch.ones(len(d), dtype=torch.bool)
        forbidden[symbols] = False
        start = seqs[:1].expand(chains, -1).clone()
        free = torch.zeros_like(start, dtype=torch.bool)
        free[:, 1:5] = True
        owner = torch.zeros(chains, dtype=torch.long)
        results = {}
        for kernel in ("mh", "gibbs"):
            cfg = mcmc.MHConfig(energy=energy, kernel=kernel, burn_in=0, epochs=12, block_size=block, top_p=top_p,
                                nucleus_mix=0.3, target_temperature=T, proposal_temperature=T)
            out = mcmc.run_chains(cmlm_logits_fn(model, enc), start, free, owner, d.unk(), cfg, forbidden=forbidden,
                                  generator=torch.Generator().manual_seed(1))
            state = sum((out.tokens[:, 1 + i] - d.nspecial) * 3 ** (3 - i) for i in range(4))
            freq = torch.bincount(state, minlength=81).double() / chains
            results[kernel] = 0.5 * (freq - p).abs().sum().item()
    draws = torch.multinomial(p.float(), chains, replacement=True, generator=torch.Generator().manual_seed(0))
    iid = 0.5 * (torch.bincount(draws, minlength=81).double() / chains - p).abs().sum().item()
    assert results["mh"] < 1.5 * iid + 0.02, (results, iid)
    assert results["gibbs"] > results["mh"] + 0.03, (results, iid)


def test_plot_mh_averages_a_run_over_its_seeds(tmp_path):
    """A run given as comma-joined stats files (one per sampler seed) is one row: mean
    +- sample std over the seeds of each seed's post-burn-in averages. Hand-computed:
    seed 1 accepts 5/10 and 7/10 after burn-in (0.6), seed 2 3/10 and 5/10 (0.4): mean
    0.5, std sqrt(2 x 0.1^2 / 1) = 0.141; E_local 4 and 2 (seed 1), 1 and 1 (seed 2):
    mean 2, std 1.414. Seeds that differ in shape are refused."""
    def stats(path, accepted, e_local, epochs=3):
        eps = [{"proposals": [10], "accepted": [a], "novel": [a], "e_local": [e], "e_raw": [-e]}
               for a, e in zip(accepted, e_local)][:epochs]
        path.write_text(json.dumps({"id": 0, "ref": "a b", "burn_in": 1, "epochs": eps}) + "\n")
        return str(path)

    s1 = stats(tmp_path / "s1.jsonl", [0, 5, 7], [9, 4, 2])
    s2 = stats(tmp_path / "s2.jsonl", [0, 3, 5], [9, 1, 1])
    out = run_cli(["python", "scripts/plot/plot_mh.py", f"{s1},{s2}", s1, "--labels", "both,one",
                   "--json", str(tmp_path / "mh.json")]).stdout
    assert "| both | 1 x 1 | 2 | 2.00 +- 1.41 | -2.00 +- 1.41 | 0.500 +- 0.141 | 0.500 +- 0.141 | - |" in out
    assert "| one | 1 x 1 | 1 | 3.00 | -3.00 | 0.600 | 0.600 | - |" in out
    both = json.loads((tmp_path / "mh.json").read_text())["both"]
    assert both["curves"]["accept"] == pytest.approx([0.0, 0.4, 0.6])
    assert [s["accept"] for s in both["per_seed"]] == pytest.approx([0.6, 0.4])
    short = stats(tmp_path / "short.jsonl", [0, 5, 7], [9, 4, 2], epochs=2)
    with pytest.raises(AssertionError, match="seeds of one run differ"):
        run_cli(["python", "scripts/plot/plot_mh.py", f"{s1},{short}"])
    # a seed's --json stands in for its stats file (when there is no stats file): the same
    # hand-computed row; a pooled --json (two seeds) is refused, naming the file
    c2 = tmp_path / "s2.curves.json"
    run_cli(["python", "scripts/plot/plot_mh.py", s2, "--json", str(c2)])
    (tmp_path / "s2.jsonl").unlink()
    out = run_cli(["python", "scripts/plot/plot_mh.py", f"{s1},{c2}", str(c2)]).stdout
    assert "| s1 | 1 x 1 | 2 | 2.00 +- 1.41 | -2.00 +- 1.41 | 0.500 +- 0.141 | 0.500 +- 0.141 | - |" in out
    assert "| s2 | 1 x 1 | 1 | 1.00 | -1.00 | 0.400 | 0.400 | - |" in out
    two_runs = tmp_path / "mh.json"  # "both" and "one", written above
    message = f"plot_mh: {two_runs} is not plot_mh.py --json output of one run"
    with pytest.raises(AssertionError, match=re.escape(message)):
        run_cli(["python", "scripts/plot/plot_mh.py", f"{s1},{two_runs}"])
    pooled = tmp_path / "pooled.json"
    run_cli(["python", "scripts/plot/plot_mh.py", f"{s1},{c2}", "--labels", "both", "--json", str(pooled)])
    with pytest.raises(AssertionError, match=re.escape(f"plot_mh: {pooled} holds a run pooled over 2 seeds")):
        run_cli(["python", "scripts/plot/plot_mh.py", f"{s1},{pooled}"])


def test_plot_mh_draws_the_chosen_curves_as_panels_of_one_figure(tmp_path):
    """--panels: one PREFIX.png, a panel per --curves entry (4 x 3.2 inches each at
    110 dpi); bad --curves / --bleu-line values are refused, naming the option, before
    any figure is written."""
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    eps = [{"proposals": [10], "accepted": [a], "novel": [a], "e_local": [e], "e_raw": [-e]}
           for a, e in zip([9, 5, 7], [9, 4, 2])]
    stats = tmp_path / "s.jsonl"
    stats.write_text(json.dumps({"id": 0, "ref": "a b", "burn_in": 1, "epochs": eps}) + "\n")
    run_cli(["python", "scripts/plot/plot_mh.py", str(stats), "--png", str(tmp_path / "fig"), "--panels",
             "--curves", "accept,e_local", "--bleu-line", "Mask-Predict=26.4"])
    assert imread(str(tmp_path / "fig.png")).shape[:2] == (352, 880)
    assert not list(tmp_path.glob("fig_*.png"))
    for bad, message in ((["--curves", "accept,energy"], "plot_mh: --curves: unknown curve 'energy'"),
                         (["--bleu-line", "26.4"], "plot_mh: --bleu-line: expected NAME=VALUE, got '26.4'"),
                         (["--bleu-line", "MP=high"], "plot_mh: --bleu-line: expected NAME=VALUE, got 'MP=high'")):
        with pytest.raises(AssertionError, match=re.escape(message)):
            run_cli(["python", "scripts/plot/plot_mh.py", str(stats), "--png", str(tmp_path / "x"), *bad])
    assert not list(tmp_path.glob("x*"))


def _mh_run(toy_bin, cmlm, monkeypatch, *options):
    """The sampler ``fairseq-generate --task translation_mh`` builds from ``options`` (the trained
    tiny cmlm), run on 6 validation sentences: {"hyps": the printed token rows, "blocks": the
    (C, L) block of every proposal step, "rows": the rows of every decoder call, "temperatures": the
    target temperature of every acceptance test}."""
    from fairseq_ext.generators import mh_sampler

    task, model, args = tiny_models.build_task_and_model(
        toy_bin, "translation_mh", "cmlm_transformer", ["--dropout", "0", *options], seed=1)
    model.load_state_dict(torch.load(cmlm, weights_only=False)["model"])
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(6)])
    seen = {"blocks": [], "rows": [], "temperatures": []}
    block_at, log_acceptance, logits_fn = mcmc.block_at, mcmc.log_acceptance, mh_sampler.cmlm_logits_fn

    def counted_logits_fn(*a):
        fn = logits_fn(*a)
        return lambda tokens, *rest: seen["rows"].append(tokens.size(0)) or fn(tokens, *rest)

    with monkeypatch.context() as patch:
        patch.setattr(mcmc, "block_at", lambda *a: seen["blocks"].append(block_at(*a)) or seen["blocks"][-1])
        patch.setattr(mcmc, "log_acceptance", lambda *a: seen["temperatures"].append(a[-1]) or log_acceptance(*a))
        patch.setattr(mh_sampler, "cmlm_logits_fn", counted_logits_fn)
        generator = task.build_generator([model], args)
        with torch.no_grad():
            seen["hyps"] = [h[0]["tokens"].tolist() for h in generator.generate([model], sample)]
    return seen


def _block_positions(blocks):
    """Per chain, the positions its blocks of size 1 proposed at, in step order."""
    out = {}
    for block in blocks:
        for row, pos in block.nonzero().tolist():
            out.setdefault(row, []).append(pos)
    return out


def test_mh_order_left_to_right_visits_the_positions_in_order(toy_bin, cmlm, monkeypatch):
    """--mh-order left-to-right: every chain proposes at its positions in increasing order, each once
    an epoch; the default (random) visits the same positions in another order."""
    epoch = ["--mh-burn-in", "0", "--mh-epochs", "1"]
    ordered = _block_positions(_mh_run(toy_bin, cmlm, monkeypatch, *epoch, "--mh-order", "left-to-right")["blocks"])
    shuffled = _block_positions(_mh_run(toy_bin, cmlm, monkeypatch, *epoch)["blocks"])
    assert all(p == sorted(set(p)) for p in ordered.values()) and len(ordered) == 6
    assert {r: sorted(p) for r, p in shuffled.items()} == ordered
    assert any(p != sorted(p) for p in shuffled.values())


def test_mh_max_rows_bounds_every_decoder_call_and_changes_no_draw(toy_bin, cmlm, monkeypatch):
    """--mh-max-rows 3: no decoder call runs more than 3 rows (the greedy start's pass over the all-masked
    targets included; the default 4096 runs every single-masked copy of the batch at once), and the chains
    end where they end without the bound."""
    epochs = ["--mh-burn-in", "1", "--mh-epochs", "1"]
    bounded = _mh_run(toy_bin, cmlm, monkeypatch, *epochs, "--mh-max-rows", "3")
    free = _mh_run(toy_bin, cmlm, monkeypatch, *epochs)
    assert max(bounded["rows"]) == 3 and max(free["rows"]) > 3
    assert bounded["hyps"] == free["hyps"]


def test_mh_target_temperature_and_its_floor_reach_every_acceptance_test(toy_bin, cmlm, monkeypatch):
    """--mh-target-temperature 2 annealed by 0.5 an epoch (--mh-target-anneal) down to
    --mh-min-target-temperature 0.3: the acceptance tests of epochs 0..4 divide by 2, 1.5, 1, 0.5, 0.3
    (by hand); at the defaults every test divides by 1."""
    run = _mh_run(toy_bin, cmlm, monkeypatch, "--mh-burn-in", "1", "--mh-epochs", "4", "--mh-target-temperature", "2",
                  "--mh-target-anneal", "0.5", "--mh-min-target-temperature", "0.3")
    steps = len(run["temperatures"]) // 5
    assert [run["temperatures"][e * steps] for e in range(5)] == [2.0, 1.5, 1.0, 0.5, 0.3]
    assert sorted(set(run["temperatures"]), reverse=True) == [2.0, 1.5, 1.0, 0.5, 0.3]
    assert set(_mh_run(toy_bin, cmlm, monkeypatch, "--mh-burn-in", "1", "--mh-epochs", "1")["temperatures"]) == {1.0}
