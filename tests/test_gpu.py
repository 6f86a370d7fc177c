"""CUDA-only checks (skipped without a GPU; see docs/distributed.md): mixed
precision (``--fp16``, ``--memory-efficient-fp16``, ``--amp``) for MGS, DSS and the
soft beam criterion through fairseq-train, MGS's update independent of the loss
scale, and MGS's bitwise restoration of half-precision parameters."""
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import REPO, cli_env, run_cli
from fairseq_ext.synthetic import tiny_models
from fairseq_ext.core.parameter_search import ParameterSearch, ProposalConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SCRIPT = os.path.join(REPO, "tests", "dist_train.py")  # fairseq-train that dumps parameters per update
CRITERIA = {
    "mgs": ["--criterion", "mgs", "--mgs-candidates", "2", "--mgs-task-loss", "edit"],
    "differentiable_scheduled_sampling": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule",
                                          "always", "--dss-warmup", "0", "--dss-mode", "soft-sample"],
    "soft_beam_direct_loss": ["--criterion", "soft_beam_direct_loss", "--soft-beam-size", "3"],
}
PRECISIONS = {"fp16": ["--fp16"], "memory-efficient-fp16": ["--memory-efficient-fp16"], "amp": ["--amp"]}


def _train(data, out, extra, arch="transformer"):
    os.makedirs(out, exist_ok=True)
    env = cli_env(DUMP_DIR=str(out))
    proc = subprocess.run([sys.executable, SCRIPT, data, "--user-dir", os.path.join(REPO, "fairseq_ext"),
                           "--task", "translation", *tiny_models.TINY_ARCHS[arch], "--optimizer", "adam",
                           "--lr", "0.003", "--max-tokens", "400", "--max-update", "6", "--seed", "1",
                           "--num-workers", "0", "--no-save", "--disable-validation", "--log-format", "json",
                           "--log-interval", "1", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads(l[l.index("{"):]) for l in proc.stdout.splitlines() + proc.stderr.splitlines()
            if "train_inner" in l and "{" in l]


@pytest.mark.timeout(280)  # nine fairseq processes; the first test in the file, so it starts first under xdist
def test_translation_search_decodes_in_fp16(toy_bin, tmp_path):
    """A transformer trained in fp16 decoded by --task translation_search on CUDA:
    beam 1 of the hard search is fairseq's greedy output, and the soft beam at alpha
    1e9 prints the hard beam's hypotheses (float32); fp16 decoding runs and mostly
    agrees."""
    user = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
    run_cli(["fairseq-train", toy_bin, *user, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
             "--criterion", "cross_entropy", "--optimizer", "adam", "--lr", "0.01", "--max-tokens", "400",
             "--max-update", "150", "--fp16", "--num-workers", "0", "--save-dir", str(tmp_path / "ck"),
             "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"])
    base = ["fairseq-generate", toy_bin, *user, "--task", "translation_search", "--path",
            str(tmp_path / "ck" / "checkpoint_last.pt"), "--gen-subset", "valid", "--batch-size", "16"]
    hyps = _decode_both_precisions(base, {
        "fairseq1": ["--beam", "1"], "hard1": ["--beam", "1", "--search-algorithm", "hard"],
        "hard3": ["--beam", "3", "--search-algorithm", "hard"],
        "soft3": ["--beam", "3", "--search-algorithm", "soft", "--search-alpha", "1e9"]})
    assert len(hyps["fairseq1"]) == 40
    assert hyps["hard1"] == hyps["fairseq1"]
    assert hyps["soft3"] == hyps["hard3"]


def test_amp_update_is_the_float32_update(toy_bin, tmp_path):
    """fairseq 0.12's --amp made every update the optimizer's step on gradient / loss scale
    (the gradient unscaled twice; fixed by fairseq_ext.runtime.checkpoints.patch_amp_loss_scaler). With
    SGD without momentum the step is lr x gradient: an --amp step must be the float32 step up
    to half precision's rounding, not 1/128 of it (the default initial scale)."""
    sgd = ["--criterion", "cross_entropy", "--max-update", "2", "--optimizer", "sgd", "--lr", "0.5", "--momentum", "0.0"]
    steps = {}
    for name, extra in (("fp32", []), ("amp", ["--amp"])):
        _train(toy_bin, tmp_path / name, sgd + extra)
        a, b = (torch.load(tmp_path / name / f"rank0.update{u}.pt") for u in (1, 2))
        steps[name] = torch.cat([(b[k].double() - a[k].double()).flatten() for k in a if a[k].is_floating_point()])
    ratio = float(steps["amp"].norm() / steps["fp32"].norm())
    cosine = float(torch.nn.functional.cosine_similarity(steps["amp"], steps["fp32"], dim=0))
    assert 0.9 < ratio < 1.1 and cosine > 0.95, f"--amp step / float32 step: norm ratio {ratio:.4f}, cosine {cosine:.4f}"


@pytest.mark.parametrize("precision", ["fp16", "amp"])
def test_mgs_update_does_not_depend_on_the_loss_scale(precision, toy_bin, tmp_path):
    """The MGS direction is handed to fairseq as a gradient, which fairseq scales and
    unscales by a power of two: the updates must be bitwise the same at loss scales 4
    and 1024 (Adam turns a difference in the gradient into different bits; MGS
    forgetting the scale, or applying it twice, shows at the first update). CUDA kernels
    with atomic adds (embedding backward) need not repeat bitwise, and one flipped greedy
    token changes MGS's weights: so two runs at each scale are made, and the runs at two
    scales must agree as far as the runs at one scale agree. The first differences of
    all pairs are reported as a warning. Under --amp the scaler follows --amp-init-scale
    and --amp-scale-window only with fairseq_ext.runtime.checkpoints.patch_amp_loss_scaler: fairseq
    0.12 itself starts at --fp16-init-scale and grows the scale every --amp-init-scale
    updates (run 4 then doubled its scale after update 4 and parted from run 1024 at
    update 5, docs/performance.md)."""
    prefix = "--fp16" if precision == "fp16" else "--amp"
    runs = {"4": "4", "4b": "4", "1024": "1024", "1024b": "1024"}
    for run, scale in runs.items():
        _train(toy_bin, tmp_path / run, CRITERIA["mgs"] + PRECISIONS[precision]
               + [f"{prefix}-init-scale", scale, f"{prefix}-scale-window", "1000"])

    def first_difference(x, y):
        for update in range(1, 7):
            a, b = (torch.load(tmp_path / r / f"rank0.update{update}.pt") for r in (x, y))
            if not all(torch.equal(a[k], b[k]) for k in a):
                return update
        return 7  # agree through update 6

    pairs = {(x, y): first_difference(x, y) for x, y in (("4", "4b"), ("1024", "1024b"), ("4", "1024"), ("4b", "1024b"))}
    report = ", ".join(f"{x} vs {y}: {d if d < 7 else 'none'}" for (x, y), d in pairs.items())
    warnings.warn(f"mgs {precision}: first differing update of runs at loss scales {report}")
    repeat = min(pairs[("4", "4b")], pairs[("1024", "1024b")])
    assert repeat > 1, f"two runs at one scale differ at the first update ({report})"
    assert min(pairs[("4", "1024")], pairs[("4b", "1024b")]) >= repeat, f"the update depends on the loss scale ({report})"


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_mixed_precision_training_stays_finite(criterion, precision, toy_bin, tmp_path):
    logs = _train(toy_bin, tmp_path, CRITERIA[criterion] + PRECISIONS[precision])
    assert len(logs) == 6
    assert all(math.isfinite(float(log["loss"])) for log in logs)
    last = torch.load(tmp_path / "rank0.update6.pt")
    assert all(torch.isfinite(v.float()).all() for v in last.values() if v.is_floating_point())


def test_mgs_restores_half_precision_cuda_parameters_bitwise():
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(64, 32, generator=gen).cuda().half(), torch.randn(32, generator=gen).cuda().half()]
    grads = [torch.randn_like(p, dtype=torch.float32) * 1e-3 for p in params]
    before = [p.clone() for p in params]
    search = ParameterSearch(params, grads, ProposalConfig(num_candidates=3, noise=1.0), seed=7)
    for k in range(3):
        with search.perturbed(k):
            assert any(not torch.equal(p, b) for p, b in zip(params, before))
        assert all(torch.equal(p, b) for p, b in zip(params, before))


# ------------------------------------------------------------- every criterion, fp16, through the CLI
# A few updates of every criterion of the plugin with --fp16 on one GPU (docs/performance.md,
# "GPU"): the losses logged and the parameters stay finite, and the updates move the parameters
# (fairseq skips an update whose fp16 gradients overflow; four skipped updates would leave the
# parameters where they started and pass every finiteness check).
EVERY = {
    "cross_entropy": ["--criterion", "cross_entropy"],
    "self_normalized_ce": ["--criterion", "self_normalized_ce"],
    "dss_soft_argmax": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule", "always",
                        "--dss-warmup", "0"],
    "dss_hard_sample": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule", "always",
                        "--dss-warmup", "0", "--dss-mode", "hard-sample"],
    "soft_beam_direct_loss": ["--criterion", "soft_beam_direct_loss", "--soft-beam-size", "3"],
    "soft_beam_hinge": ["--criterion", "soft_beam_hinge", "--soft-beam-size", "3"],
    "mrt": ["--criterion", "mrt", "--mrt-candidates", "4", "--mrt-task-loss", "edit"],
    "pg": ["--criterion", "pg", "--pg-samples", "4", "--pg-task-loss", "edit", "--pg-baseline", "greedy"],
    "mgs": ["--criterion", "mgs", "--mgs-candidates", "4", "--mgs-task-loss", "edit"],
}


def _moved_and_finite(out, first, last):
    a, b = torch.load(out / f"rank0.update{first}.pt"), torch.load(out / f"rank0.update{last}.pt")
    assert all(torch.isfinite(v.float()).all() for v in b.values() if v.is_floating_point())
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point()), "no update was applied"


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
@pytest.mark.parametrize("criterion", list(EVERY))
def test_every_translation_criterion_trains_in_fp16(criterion, arch, toy_bin, tmp_path):
    logs = _train(toy_bin, tmp_path, EVERY[criterion] + ["--fp16"], arch)
    assert len(logs) == 6 and all(math.isfinite(float(log["loss"])) for log in logs)
    _moved_and_finite(tmp_path, 1, 6)



def _texts(stdout):
    """{sentence id: hypothesis text} of fairseq-generate's H- lines (scores left out)."""
    return {l.split("\t")[0]: l.split("\t")[-1] for l in stdout.splitlines() if l.startswith("H-")}


def _json_lines(proc, tag):
    return [json.loads(l[l.index("{"):]) for l in (proc.stdout + proc.stderr).splitlines() if tag in l and "{" in l]


def test_tagging_soft_beam_trains_and_decodes_in_fp16(conll, cache, tmp_path):
    """tagging_lstm with the soft beam criterion in fp16, then fairseq-generate's soft
    and hard tagging searches on CUDA: the same tags at alpha 1e9 (float32); fp16
    decoding runs and mostly agrees."""
    user = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
    data = [conll, *user, "--task", "sequence_tagging", "--tagging-cache-dir", cache]
    proc = run_cli(["fairseq-train", *data, "--arch", "tagging_lstm_tiny", "--batch-size", "16",
                    "--criterion", "soft_beam_direct_loss", "--soft-beam-size", "3", "--optimizer", "adam",
                    "--lr", "0.01", "--max-update", "20", "--fp16", "--log-format", "json", "--log-interval", "5",
                    "--save-dir", str(tmp_path / "ck"), "--no-epoch-checkpoints", "--disable-validation",
                    "--num-workers", "0", "--seed", "1"])
    logs = _json_lines(proc, "train_inner")
    assert logs and all(math.isfinite(float(log["loss"])) for log in logs)
    base = ["fairseq-generate", *data, "--path", str(tmp_path / "ck" / "checkpoint_last.pt"), "--gen-subset", "valid",
            "--batch-size", "16", "--beam", "3"]
    hyps = _decode_both_precisions(base, {"hard": ["--search-algorithm", "hard"],
                                          "soft": ["--search-algorithm", "soft", "--search-alpha", "1e9"]})
    assert hyps["hard"] and hyps["soft"] == hyps["hard"]


def _decode_both_precisions(base, searches):
    """{search: hypotheses} of each search decoded in float32 on CUDA, where the exact
    equalities are asserted; each is also decoded with --fp16, which must print as
    many hypotheses with finite scores and agree with float32 on most sentences (half
    precision rounds near-ties of the scores differently, so not on all)."""
    hyps = {}
    for name, extra in searches.items():
        hyps[name] = _texts(run_cli(base + extra).stdout)
        half = run_cli(base + extra + ["--fp16"]).stdout
        scores = [float(l.split("\t")[1]) for l in half.splitlines() if l.startswith("H-")]
        assert len(scores) == len(hyps[name]) and all(math.isfinite(x) for x in scores), name
        same = sum(_texts(half)[i] == h for i, h in hyps[name].items())
        assert same >= 0.8 * len(hyps[name]), f"{name}: fp16 agrees with float32 on {same} of {len(hyps[name])}"
    return hyps


def test_residual_nce_trains_in_fp16(toy_lm_bin, tmp_path):
    """The base LM, its negatives and the residual energy model trained in fp16 on CUDA."""
    task = ["--user-dir", "fairseq_ext", "--task", "residual_lm", "--residual-prefix-len", "8",
            "--residual-continuation-len", "4"]
    run_cli(["fairseq-train", toy_lm_bin, "--user-dir", "fairseq_ext", "--task", "language_modeling",
             "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
             "--decoder-output-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
             "--tokens-per-sample", "64", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000",
             "--max-update", "30", "--save-dir", str(tmp_path / "lm"), "--no-epoch-checkpoints",
             "--disable-validation", "--fp16", "--seed", "1"], cwd=REPO)
    base_lm = str(tmp_path / "lm" / "checkpoint_last.pt")
    run_cli(["python", "scripts/prepare/sample_negatives.py", toy_lm_bin, "--residual-base-lm", base_lm,
             "--splits", "train,valid", "--num-samples", "4", "--out-dir", str(tmp_path / "neg")] + task, cwd=REPO)
    proc = run_cli(["fairseq-train", toy_lm_bin, "--residual-base-lm", base_lm, "--residual-negatives-dir",
                    str(tmp_path / "neg"), "--residual-num-negatives", "2", "--arch", "residual_energy",
                    "--energy-variant", "bit",
                    "--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                    "--encoder-attention-heads", "2", "--criterion", "residual_nce", "--optimizer", "adam",
                    "--lr", "0.003", "--batch-size", "16", "--max-update", "20", "--fp16",
                    "--save-dir", str(tmp_path / "ebm"), "--no-epoch-checkpoints", "--log-format", "json",
                    "--log-interval", "5", "--seed", "1"] + task, cwd=REPO)
    logs = _json_lines(proc, "train_inner") + _json_lines(proc, "| valid |")
    assert logs and all(math.isfinite(float(log[k])) for log in logs for k in log if k.endswith("loss"))


def test_mh_sampler_runs_on_cuda(toy_bin, tmp_path):
    """A tiny CMLM trained in fp16 on CUDA, then the Metropolis-Hastings sampler of
    --task translation_mh in fp16: one hypothesis per sentence, finite statistics."""
    user = ["--user-dir", os.path.join(REPO, "fairseq_ext")]
    run_cli(["fairseq-train", toy_bin, *user, "--task", "translation_mh", *tiny_models.TINY_ARCHS["cmlm_transformer"],
             "--criterion", "nat_loss", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "500",
             "--max-epoch", "10", "--fp16", "--save-dir", str(tmp_path / "ck"), "--no-epoch-checkpoints",
             "--num-workers", "0", "--seed", "1"])
    gen = run_cli(["fairseq-generate", toy_bin, *user, "--task", "translation_mh", "--path",
                   str(tmp_path / "ck" / "checkpoint_last.pt"), "--gen-subset", "valid", "--batch-size", "12",
                   "--seed", "3", "--fp16", "--mh-burn-in", "2", "--mh-epochs", "2"])
    scores = [float(l.split("\t")[1]) for l in gen.stdout.splitlines() if l.startswith("H-")]
    assert len(scores) == 40 and all(math.isfinite(s) for s in scores)


@pytest.mark.parametrize("arch", ["transformer", "transformer_lm", "lstm", "lstm_lm"])
def test_static_cache_decoding_on_cuda(arch, toy_bin, toy_lm_bin):
    """The static-cache decoder steps on CUDA (float32): fairseq's full teacher-forced forward
    within 1e-4 at every position, and candidates equal to fairseq's incremental path's
    (greedy, and sampled with one CUDA generator: the same draws for the same rows); under
    autocast (float16), finite scores of as many candidates."""
    from fairseq import utils

    from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates
    from fairseq_ext.decoding.steps import decoder_step, unsupported_reason
    from fairseq_ext.decoding.batch import decode_inputs

    data, task_name, extra = ((toy_bin, "translation", []) if arch in ("transformer", "lstm")
                              else (toy_lm_bin, "text_completion", ["--completion-context-size", "3"]))
    task, model, _ = tiny_models.build_task_and_model(data, task_name, arch, extra, seed=2)
    model = model.cuda().eval()
    assert unsupported_reason(model.decoder) is None
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = utils.move_to_cuda(ds.collater([ds[i] for i in range(12)]))
    batch, prefix = decode_inputs(sample, task.target_dictionary)
    d = task.target_dictionary
    with torch.no_grad():
        if arch in ("transformer", "lstm"):
            enc = model.encoder.forward_torchscript(sample["net_input"])
            prev = sample["net_input"]["prev_output_tokens"]
            full = model.decoder(prev, encoder_out=enc)[0]
        else:
            enc = None
            p = sample["prefix"]
            prev = torch.cat([torch.full((p.size(0), 1), d.eos(), device=p.device), p, sample["target"][:, :-1]], 1)
            full = model.decoder(prev)[0]
        step = decoder_step(model, enc, torch.arange(prev.size(0), device=prev.device), prev.size(1))
        lean = torch.stack([step.logits(prev[:, t]) for t in range(prev.size(1))], 1)
        real = prev.ne(d.pad())
        assert (lean - full)[real].abs().max().item() < 1e-4
    for cfg in (dict(), dict(strategy="sample", num_candidates=3, topk=10)):
        out = [decode_candidates(model, batch, DecodeConfig(path=path, max_len_b=12, **cfg), prefix_tokens=prefix,
                                 generator=torch.Generator(device="cuda").manual_seed(3))
               for path in ("static-cache", "fairseq")]
        assert torch.equal(out[0].tokens, out[1].tokens) and torch.equal(out[0].finished, out[1].finished)
        assert (out[0].scores - out[1].scores).abs().max().item() < 1e-3
    with torch.autocast("cuda", dtype=torch.float16):
        half = decode_candidates(model, batch, DecodeConfig(max_len_b=12), prefix_tokens=prefix)
    assert half.tokens.size(0) == sample["target"].size(0) and torch.isfinite(half.scores).all()


@pytest.mark.parametrize("which", ["transformer", "transformer_lm"])
def test_mgs_candidates_together_on_cuda(which, toy_bin, toy_lm_bin):
    """MGS on CUDA: theta and its K perturbations decoded together (grouped weights) give
    the update of one candidate at a time (costs, weights, direction)."""
    from fairseq import utils

    data, task_name = (toy_bin, "translation") if which == "transformer" else (toy_lm_bin, "text_completion")
    runs = []
    for mode in ("batched", "sequential"):
        extra = ["--criterion", "mgs", "--mgs-task-loss", "edit", "--mgs-noise", "30", "--mgs-candidate-evaluation", mode]
        if task_name == "text_completion":
            extra += ["--completion-context-size", "3"]
        task, model, args = tiny_models.build_task_and_model(data, task_name, which, extra, seed=3)
        model = model.cuda().train()
        task.load_dataset("valid")
        ds = task.dataset("valid")
        sample = utils.move_to_cuda(ds.collater([ds[i] for i in range(8)]))
        crit = task.build_criterion(args)
        torch.manual_seed(0)
        torch.cuda.manual_seed(0)
        loss, _, log = crit(model, sample)
        loss.backward()
        assert crit.batched == (mode == "batched")
        runs.append((log, torch.cat([p.grad.view(-1) for p in model.parameters() if p.requires_grad])))
    (log_b, grad_b), (log_s, grad_s) = runs
    for key in ("loss", "mgs_cand_mean", "mgs_cand_best", "mgs_weight_entropy"):
        assert log_b[key] == pytest.approx(log_s[key], rel=1e-5, abs=1e-7), key
    assert (grad_b - grad_s).abs().max().item() <= 1e-5 * grad_s.abs().max().item()
