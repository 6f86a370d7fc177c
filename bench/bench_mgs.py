"""Cost of one ``--criterion mgs`` training step: time against an MLE step plus the
same number of greedy decodes, and peak memory against the number of candidates K,
all measured in the same run.

Run: ``.venv/bin/python bench/bench_mgs.py`` (about 2-3 minutes on one CPU core;
``--quick`` for a few-second smoke run, ``--json FILE`` to keep the rows).

Data: the embedded toy corpus (``fairseq_ext.synthetic.toy``) binarized in a temp dir; batches
are the first B training pairs. Weights are random (untrained), so greedy decodes
nearly always run to the length limit, ceil(1.3 x the longest reference), for the
unperturbed and the perturbed models alike (the table reports the mean length).

Speed (``transformer``, 3+3 layers, embed 256, ffn 1024, 4 heads; train mode):

- ``MGS``: ``MGSCriterion(task, mgs_candidates=K, mgs_task_loss="edit",
  mgs_decoder="greedy")`` forward on the batch, then ``backward()`` of the returned
  surrogate (whose gradient is -Delta). K = ``--candidates`` (default 4).
- ``baseline``: fairseq's ``label_smoothed_cross_entropy`` (smoothing 0.1) forward and
  backward on the same batch, plus K + 1 ``decode_candidates`` greedy decodes with
  the same length rule (``DecodeConfig(max_len_ref_ratio=1.3)``): the work MGS cannot
  avoid (one decode for C(theta), one per candidate, one MLE gradient).
- ratio = MGS / baseline; the target is <= 1.15.

Both are timed around one call, ``--warmup`` untimed calls then ``--repeats`` timed
ones, interleaved (alternating which goes first), median reported;
``torch.set_num_threads(--threads)``; gradients are reset to None before each call.
The clock (``--clock``) is the process's CPU time on CPU (``time.process_time``: on a
shared machine wall time also counts the time other processes hold the core; with
one thread it equals wall time on an idle machine; it still varies with the load,
through shared caches and memory bandwidth) and wall time on CUDA.

The breakdown times the step's parts separately on the same batch and model,
through the criterion's own objects and ``fairseq_ext.core.parameter_search`` (the criterion is
not modified): decode (one ``decode_batch``) and score (one edit cost
over the batch), each x (K + 1); the MLE gradient (``_mle_gradient`` + ``clip_grad_``);
perturb/restore (entering and leaving ``ParameterSearch.perturbed(k)`` for the K
candidates, including the one backup), of which ``draw`` is drawing every
eps_k tensor alone (into the scratch buffer, as the step does); ``direction`` (uniform weights, all K pieces again);
the surrogate (building sum <p, -Delta> and its backward). ``other`` = step - parts
(timed in different calls, so under a varying load it can come out negative).

Memory (``transformer``, 4+4 layers, embed 512, ffn 2048, 8 heads, about 30M
parameters, so a parameter copy is far above RSS noise; batch ``--mem-batch-size``):
one fresh child process per row (run concurrently) builds the model and runs ONE step without warm-up:
``MLE`` (the baseline's forward + backward, no decode) and ``MGS`` for each K in
``--mem-candidates`` (default 2 and 8). On CPU each child reports its peak RSS
(``ru_maxrss``; torch's allocations are invisible to ``tracemalloc``) after building
the model and batch and at the end. The children run with glibc's
``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB: otherwise glibc raises the threshold
each time a large block is freed, later tensors land in the heap and are kept after
they die, and the peak depends on allocation order (about +-10 MiB between runs of
the same K; with the fixed threshold, under 1 MiB). On CUDA the children report
``torch.cuda.max_memory_allocated`` (after ``reset_peak_memory_stats``) and the
allocation after the build. The table reports each peak, the peak above the MLE
row's, the K_max - K_min difference in MiB and in parameter copies (4 bytes x
parameters; the design bound is below one copy), and what one deep copy of the model
per candidate (the published implementation) would add: K x parameter bytes.
Timings and memory are printed, never asserted.
"""
import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq import utils
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from fairseq_ext.synthetic import tiny_models, toy
from fairseq_ext.core.parameter_search import ParameterSearch, clip_grad_
from fairseq_ext.criterions.mgs import MGSCriterion
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates

import timing  # bench/timing.py, beside this script

# appended after tiny_models.TINY_ARCHS["transformer"]: argparse keeps the last value of a repeated option
SPEED_ARCH = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
              "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
MEMORY_ARCH = ["--encoder-layers", "4", "--decoder-layers", "4", "--encoder-embed-dim", "512",
               "--decoder-embed-dim", "512", "--encoder-ffn-embed-dim", "2048", "--decoder-ffn-embed-dim", "2048",
               "--encoder-attention-heads", "8", "--decoder-attention-heads", "8"]
MAX_LEN_RATIO = 1.3
MMAP_THRESHOLD = 128 * 1024  # glibc MALLOC_MMAP_THRESHOLD_ of the memory children (see the module docstring)
LABEL_SMOOTHING = 0.1
TARGET_RATIO = 1.15
MIB = 2**20


def prepare_data(tmp: str, quick: bool) -> str:
    raw = toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(200, 10, 10) if quick else (400, 10, 10))
    return toy.binarize_translation(raw, os.path.join(tmp, "bin"))


def build(data: str, arch_extra: List[str], seed: int, device: torch.device):
    """(task, model in train mode on ``device``) for the toy translation task."""
    task, model, _ = tiny_models.build_task_and_model(data, "translation", "transformer", arch_extra, seed=seed)
    task.load_dataset("train")
    return task, model.to(device).train()


def make_batch(task, n: int, device: torch.device) -> Dict:
    """The first n training pairs as one fairseq batch."""
    ds = task.dataset("train")
    if len(ds) < n:
        raise ValueError(f"batch size {n} exceeds the {len(ds)} toy training pairs")
    return utils.apply_to_sample(lambda t: t.to(device), ds.collater([ds[i] for i in range(n)]))


def mgs_criterion(task, k: int, seed: int) -> MGSCriterion:
    return MGSCriterion(task, mgs_candidates=k, mgs_task_loss="edit", mgs_decoder="greedy",
                        mgs_max_len_ratio=MAX_LEN_RATIO, seed=seed)


def mle_criterion(task) -> LabelSmoothedCrossEntropyCriterion:
    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=LABEL_SMOOTHING)


def mgs_step(model, sample: Dict, crit: MGSCriterion) -> None:
    model.zero_grad(set_to_none=True)
    surrogate, _, _ = crit(model, sample)
    surrogate.backward()


def mle_step(model, sample: Dict, crit) -> None:
    model.zero_grad(set_to_none=True)
    loss, _, _ = crit(model, sample)
    loss.backward()


_clock = time.perf_counter


def timed(fn: Callable, device: torch.device) -> float:
    """ms of one call on the ``--clock``."""
    return timing.timed(fn, device, _clock)


def median_ms(fns: Dict[str, Callable], warmup: int, repeats: int, device: torch.device) -> Dict[str, float]:
    """Median ms of each function over ``repeats`` interleaved calls after ``warmup`` rounds."""
    return timing.interleaved(fns, warmup, repeats, device, _clock)[0]


def breakdown(model, sample: Dict, crit: MGSCriterion, args, device: torch.device) -> Dict[str, float]:
    """Median ms of the MGS step's parts, each timed on its own (see the module docstring)."""
    k = crit.proposal.num_candidates
    decoded = decode_batch(model, sample, crit.decode_cfg)
    cand, batch = decoded.candidates, decoded.batch
    params, grads, _, _ = crit._mle_gradient(model, sample)
    clip_grad_(grads, crit.mle_clip)
    uniform = torch.full((k,), 1.0 / k, dtype=torch.float64)

    def perturb_restore():
        search = ParameterSearch(params, grads, crit.proposal, args.seed)
        for j in range(k):
            with search.perturbed(j):
                pass

    def draw():
        search = ParameterSearch(params, grads, crit.proposal, args.seed)
        for j in range(k):
            for i in range(len(params)):
                search._noise(j, i, reuse=True)

    def direction():
        ParameterSearch(params, grads, crit.proposal, args.seed).direction(uniform, lean=True)

    def mle_grad():
        _, g, _, _ = crit._mle_gradient(model, sample)
        clip_grad_(g, crit.mle_clip)

    def surrogate():
        model.zero_grad(set_to_none=True)
        search = ParameterSearch(params, grads, crit.proposal, args.seed)
        d = search.direction(uniform, lean=True)
        return timed(lambda: sum((p * (-x)).sum() for p, x in zip(params, search.split(d))).backward(), device)

    parts = {
        "decode": lambda: decode_batch(model, sample, crit.decode_cfg),
        "score": lambda: crit.scorer.score(cand.as_list(), cand.source_index, batch),
        "mle_grad": mle_grad,
        "perturb_restore": perturb_restore,
        "draw": draw,
        "direction": direction,
    }
    ms = median_ms(parts, args.warmup, args.repeats, device)
    surr = [surrogate() for _ in range(args.warmup + args.repeats)][args.warmup:]
    ms["surrogate"] = statistics.median(surr)
    ms["decode"] *= k + 1
    ms["score"] *= k + 1
    return ms


def bench_speed(data: str, args, device: torch.device) -> List[Dict]:
    task, model = build(data, [] if args.quick else SPEED_ARCH, args.seed, device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"speed model: transformer, {n_params / 1e6:.2f}M parameters, K={args.candidates}", flush=True)
    k = args.candidates
    crit, mle = mgs_criterion(task, k, args.seed), mle_criterion(task)
    greedy = DecodeConfig(max_len_ref_ratio=MAX_LEN_RATIO)
    rows = []
    for bsz in args.batch_sizes:
        sample = make_batch(task, bsz, device)

        def baseline():
            mle_step(model, sample, mle)
            for _ in range(k + 1):
                decode_candidates(model, sample, greedy)

        ms = median_ms({"mgs": lambda: mgs_step(model, sample, crit), "baseline": baseline},
                       args.warmup, args.repeats, device)
        parts_base = median_ms({"mle_step": lambda: mle_step(model, sample, mle),
                                "decode": lambda: decode_candidates(model, sample, greedy)},
                               args.warmup, args.repeats, device)
        parts = breakdown(model, sample, crit, args, device)
        cand = decode_candidates(model, sample, greedy)
        model.zero_grad(set_to_none=True)
        summed = sum(v for name, v in parts.items() if name != "draw")
        rows.append({
            "batch_size": bsz, "candidates": k, "mgs_ms": ms["mgs"], "baseline_ms": ms["baseline"],
            "ratio": ms["mgs"] / ms["baseline"], "target_ratio": TARGET_RATIO,
            "baseline_mle_step_ms": parts_base["mle_step"], "baseline_decode_ms": parts_base["decode"] * (k + 1),
            "breakdown_ms": {**parts, "other": ms["mgs"] - summed},
            "max_len": int(torch.ceil(MAX_LEN_RATIO * sample["target"].ne(task.target_dictionary.pad())
                                      .sum(1).max().float()).item()),
            "mean_len": float(cand.lengths.float().mean()),
        })
        print(f"  B={bsz}: MGS {ms['mgs']:.1f} ms, baseline {ms['baseline']:.1f} ms", flush=True)
    return rows


# ---------------------------------------------------------------- memory (child processes)
def memory_child(args) -> None:
    """Build the memory model, run one step (``--memory-child mle|mgs``), print a JSON line."""
    device = torch.device(args.device)
    task, model = build(args.data, [] if args.quick else MEMORY_ARCH, args.seed, device)
    sample = make_batch(task, args.mem_batch_size, device)
    n_params = sum(p.numel() for p in model.parameters())
    build_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    if args.memory_child == "mle":
        mle_step(model, sample, mle_criterion(task))
    else:
        mgs_step(model, sample, mgs_criterion(task, args.k, args.seed))
    out = {"mode": args.memory_child, "k": args.k, "params": n_params}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        out["build_peak_mib"] = base / MIB
        out["peak_mib"] = torch.cuda.max_memory_allocated(device) / MIB
    else:
        out["build_peak_mib"] = build_kib / 1024  # ru_maxrss is in KiB on Linux
        out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("MEMORY " + json.dumps(out), flush=True)


def child_command(data: str, mode: str, k: int, args) -> List[str]:
    return [sys.executable, os.path.abspath(__file__), "--memory-child", mode, "--k", str(k), "--data", data,
            "--device", args.device, "--threads", str(args.threads), "--seed", str(args.seed),
            "--mem-batch-size", str(args.mem_batch_size)] + (["--quick"] if args.quick else [])


def bench_memory(data: str, args) -> List[Dict]:
    """Run the children (concurrently: each measures only its own process) and collect their rows."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    jobs = [("mle", 0)] + [("mgs", k) for k in args.mem_candidates]
    procs = [subprocess.Popen(child_command(data, mode, k, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO, env=env) for mode, k in jobs]
    rows = []
    for (mode, k), proc in zip(jobs, procs):
        stdout, stderr = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("MEMORY ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"memory child {mode} K={k} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}")
        rows.append(json.loads(lines[-1][len("MEMORY "):]))
    copy_mib = 4 * rows[0]["params"] / MIB
    print(f"memory model: transformer, {rows[0]['params'] / 1e6:.2f}M parameters "
          f"(one fp32 copy {copy_mib:.1f} MiB), batch {args.mem_batch_size}", flush=True)
    for r in rows:
        r["param_copy_mib"] = copy_mib
        r["above_mle_mib"] = r["peak_mib"] - rows[0]["peak_mib"]
        r["above_mle_param_copies"] = r["above_mle_mib"] / copy_mib
        r["deep_copy_mib"] = r["k"] * copy_mib
    return rows


def memory_summary(rows: List[Dict]) -> Dict:
    mgs = [r for r in rows if r["mode"] == "mgs"]
    lo, hi = min(mgs, key=lambda r: r["k"]), max(mgs, key=lambda r: r["k"])
    copy_mib = rows[0]["param_copy_mib"]
    diff = hi["peak_mib"] - lo["peak_mib"]
    return {"k_low": lo["k"], "k_high": hi["k"], "peak_diff_mib": diff, "peak_diff_param_copies": diff / copy_mib,
            "param_copy_mib": copy_mib, "deep_copy_diff_mib": (hi["k"] - lo["k"]) * copy_mib}


# ---------------------------------------------------------------- output
def _table(head: List[str], lines: List[List[str]]) -> str:
    return timing.table(head, lines, left=len(head))


def format_speed(rows: List[Dict]) -> str:
    head = ["B", "K", "len (max)", "MGS ms", "baseline ms", "MGS/base", "base: MLE + decodes ms"]
    lines = [[str(r["batch_size"]), str(r["candidates"]), f"{r['mean_len']:.1f} ({r['max_len']})",
              f"{r['mgs_ms']:.1f}", f"{r['baseline_ms']:.1f}", f"{r['ratio']:.2f}x",
              f"{r['baseline_mle_step_ms']:.1f} + {r['baseline_decode_ms']:.1f}"] for r in rows]
    parts = ["decode", "score", "mle_grad", "perturb_restore", "direction", "surrogate", "other"]
    head2 = ["B"] + [p.replace("_", "/") if p != "perturb_restore" else "perturb/restore (draw)" for p in parts]
    lines2 = []
    for r in rows:
        b = r["breakdown_ms"]
        cells = [f"{b[p]:.1f} ({100 * b[p] / r['mgs_ms']:.0f}%)" for p in parts]
        cells[3] = f"{b['perturb_restore']:.1f} ({b['draw']:.1f}) ({100 * b['perturb_restore'] / r['mgs_ms']:.0f}%)"
        lines2.append([str(r["batch_size"])] + cells)
    return _table(head, lines) + "\n\nMGS step breakdown, ms (% of the step):\n" + _table(head2, lines2)


def format_memory(rows: List[Dict], summary: Dict, device: torch.device) -> str:
    what = "peak RSS" if device.type != "cuda" else "peak allocated"
    head = ["step", f"{what} after build MiB", f"{what} MiB", "above MLE MiB", "above MLE / param copy",
            "deep copies: K x params MiB"]
    lines = [["MLE" if r["mode"] == "mle" else f"MGS K={r['k']}", f"{r['build_peak_mib']:.1f}", f"{r['peak_mib']:.1f}",
              f"{r['above_mle_mib']:.1f}", f"{r['above_mle_param_copies']:.2f}",
              "-" if r["mode"] == "mle" else f"{r['deep_copy_mib']:.1f}"] for r in rows]
    s = summary
    return _table(head, lines) + (
        f"\n\n{what} K={s['k_high']} - K={s['k_low']}: {s['peak_diff_mib']:.1f} MiB = "
        f"{s['peak_diff_param_copies']:.2f} parameter copies ({s['param_copy_mib']:.1f} MiB each; bound: < 1); "
        f"deep copies would add {s['deep_copy_diff_mib']:.1f} MiB")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, for stable numbers)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="speed: sentences per batch")
    p.add_argument("--candidates", type=int, default=4, help="speed: K")
    p.add_argument("--mem-candidates", type=int, nargs="+", default=[2, 8], help="memory: the K values compared")
    p.add_argument("--mem-batch-size", type=int, default=16, help="memory: sentences per batch")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per setting (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per setting")
    p.add_argument("--clock", choices=list(timing.CLOCKS),
                   help="process CPU time (default on CPU: robust to other processes on a shared machine) "
                        "or wall time (default on CUDA)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="tiny models, B=4, one repeat, no warm-up: a few seconds (smoke test)")
    p.add_argument("--json", metavar="FILE", help="also write the settings and rows as JSON")
    p.add_argument("--memory-child", choices=["mle", "mgs"], help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick and a.memory_child is None:
        a.batch_sizes, a.repeats, a.warmup, a.mem_batch_size = [4], 1, 0, 4
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    if a.clock is None:
        a.clock = "wall" if a.device == "cuda" else "process"
    if len(set(a.mem_candidates)) < 2:
        p.error("--mem-candidates needs at least two distinct K")
    return a


def main(argv=None) -> None:
    global _clock
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    _clock = timing.CLOCKS[args.clock]
    if args.memory_child:
        memory_child(args)
        return
    device = torch.device(args.device)
    print(f"device {device}, threads {args.threads}, {args.clock} time, warm-up {args.warmup}, "
          f"median of {args.repeats}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare_data(tmp, args.quick)
        speed = bench_speed(data, args, device)
        memory = bench_memory(data, args)
    summary = memory_summary(memory)
    k = args.candidates
    print()
    print(f"Speed: one MGS step (K={k}, greedy, edit cost; forward + surrogate backward) vs baseline = one MLE step "
          f"(label-smoothed NLL forward + backward) + {k + 1} greedy decodes (max len ceil(1.3 x longest ref)); "
          f"target MGS/base <= {TARGET_RATIO}")
    print(format_speed(speed))
    print()
    print("Memory: one step in a fresh process per row (no warm-up); above MLE = this row's peak - the MLE row's "
          "peak")
    print(format_memory(memory, summary, device))
    if args.json:
        meta = {"device": str(device), "threads": args.threads, "clock": args.clock,
                "malloc_mmap_threshold": MMAP_THRESHOLD, "repeats": args.repeats, "warmup": args.warmup,
                "quick": args.quick, "candidates": k, "mem_batch_size": args.mem_batch_size,
                "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump({"settings": meta, "speed": speed, "memory": memory, "memory_summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
