"""Cost of one ``--criterion soft_beam_direct_loss`` training step, as a ratio to a
cross-entropy step on the same batch and model, for k = 3 and k = 5, and the peak
memory of each, all measured in the same run.

Run: ``.venv/bin/python bench/bench_soft_beam.py`` (about a minute on one CPU
core; ``--quick`` for a smoke run, ``--json FILE`` to keep the rows).

Models (train mode, random weights): ``tagging_lstm_ner`` (the thesis's NER
model: hidden 64, label embedding 8) on a written toy CoNLL corpus (9 labels),
and a ``transformer`` (3+3 layers, embed 256, ffn 1024, 4 heads) on the toy
translation corpus (about 80 target types); batch of the first B sentences.

Rows, each a forward and backward: ``ce`` (fairseq's ``cross_entropy``; ratio 1),
``soft beam k=3`` / ``k=5`` (our criterion, alpha 1, Hamming costs). The thesis
expects about k times a CE step (section 4.3.3). ``--compare-decoding``: the
transformer's soft beam rows also on fairseq's incremental path (the criterion's
``--decoding-path fairseq``; the transformer otherwise runs the static-cache step), in the same run.

Time: ``--warmup`` untimed rounds, ``--repeats`` interleaved rounds, median, wall
clock. Memory (CPU): each row runs in a fresh child process, one untimed step, then
the measured one (glibc's mmap
threshold fixed at 128 KiB, so freed tensors leave the RSS); a thread samples the
RSS every 0.5 ms during the step, and the table reports the peak above the RSS
before it (short peaks between samples can be missed). On CUDA: ``torch.cuda.max_memory_allocated`` above the
allocation before the step. Printed, never asserted.
"""
import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
from typing import Dict, List

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq import utils
from fairseq.criterions.cross_entropy import CrossEntropyCriterion

from fairseq_ext.synthetic import tiny_models, toy
from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion

import timing  # bench/timing.py, beside this script

BEAMS = (3, 5)


def build(name: str, tmp: str, quick: bool, batch_size: int, device: torch.device):
    """(task, model in train mode, batch) for ``tagging`` or ``transformer``."""
    if name == "tagging":
        data = toy.write_toy_conll(os.path.join(tmp, "conll"), sizes=(max(64, batch_size), 10, 10))
        # the arch's own dropout (tiny 0, ner 0.2), not build_task_and_model's 0.1
        arch = ["--arch", "tagging_lstm_tiny", "--dropout", "0.0"] if quick else \
            ["--arch", "tagging_lstm_ner", "--dropout", "0.2"]
        task, model, _ = tiny_models.build_task_and_model(data, "sequence_tagging", "tagging_lstm",
                                                  ["--tagging-cache-dir", os.path.join(tmp, "cache")] + arch)
    else:
        raw = toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(max(64, batch_size), 10, 10))
        data = toy.binarize_translation(raw, os.path.join(tmp, "bin"))
        arch = [] if quick else timing.TRANSFORMER
        task, model, _ = tiny_models.build_task_and_model(data, "translation", "transformer", arch)
    task.load_dataset("train")
    ds = task.dataset("train")
    sample = utils.apply_to_sample(lambda t: t.to(device), ds.collater([ds[i] for i in range(batch_size)]))
    return task, model.to(device).train(), sample


def criteria(task, name: str, compare: bool = False) -> Dict[str, object]:
    out = {"ce": CrossEntropyCriterion(task, sentence_avg=False)}
    for k in BEAMS:
        out[f"soft beam k={k}"] = SoftBeamDirectLossCriterion(task, soft_beam_size=k)
    if compare and name == "transformer":  # the tagger's LSTM has only fairseq's path
        for k in BEAMS:
            out[f"soft beam k={k}, fairseq decoding"] = SoftBeamDirectLossCriterion(task, soft_beam_size=k,
                                                                                     decoding_path="fairseq")
    return out


def step(model, sample, criterion) -> None:
    model.zero_grad(set_to_none=True)
    loss, _, _ = criterion(model, sample)
    loss.backward()


def child(args) -> None:
    """One step of one row in this process; prints the memory figures as JSON."""
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        task, model, sample = build(args.child_model, tmp, args.quick, args.batch_size, device)
        crit = criteria(task, args.child_model, args.compare_decoding)[args.child_row]
        step(model, sample, crit)  # one-time allocations (lazy initialisation, caches) are not the step's
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            step(model, sample, crit)
            peak = torch.cuda.max_memory_allocated(device) - base
        else:
            base = _rss()
            peak = _sampled_peak(lambda: step(model, sample, crit)) - base
    print(json.dumps({"peak_above_build_mib": peak / 2 ** 20}))


def _rss() -> int:
    """Resident set size of this process in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _sampled_peak(fn, interval: float = 0.0005) -> int:
    """Peak RSS while ``fn`` runs, sampled every ``interval`` s by a thread (glibc
    returns large blocks to the OS at once with the fixed mmap threshold, so RSS
    follows the live tensors)."""
    import threading
    import time

    peak, done = [_rss()], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(interval)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _rss())


def memory(name: str, rows: List[str], args) -> Dict[str, float]:
    out = {}
    for row in rows:
        cmd = [sys.executable, os.path.abspath(__file__), "--child-model", name, "--child-row", row, "--device",
               args.device, "--batch-size", str(args.batch_size)] + (["--quick"] if args.quick else []) + (
            ["--compare-decoding"] if args.compare_decoding else [])
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS=str(args.threads))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        out[row] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_above_build_mib"]
    return out


def bench(name: str, args, device: torch.device) -> List[Dict]:
    with tempfile.TemporaryDirectory() as tmp:
        task, model, sample = build(name, tmp, args.quick, args.batch_size, device)
        crits = criteria(task, name, args.compare_decoding)
        fns = {row: (lambda c: lambda: step(model, sample, c))(c) for row, c in crits.items()}
        ms, _ = timing.interleaved(fns, args.warmup, args.repeats, device)
        rows = [{"model": name, "row": row, "ms": ms[row], "ratio": ms[row] / ms["ce"], "batch_size": args.batch_size}
                for row in fns]
        if args.op_counts:
            timing.op_counts(fns, rows)
    mem = memory(name, list(fns), args)
    for r in rows:
        r.update(peak_mib=mem[r["row"]], peak_ratio=mem[r["row"]] / mem["ce"] if mem["ce"] > 0 else None)
    return rows


def format_table(rows: List[Dict]) -> str:
    ops_head, ops = timing.op_columns(rows)
    head = ["model", "row", "ms / step", "ratio to ce", "peak MiB", "peak / ce"] + ops_head
    lines = [[r["model"], r["row"], f"{r['ms']:.1f}", f"{r['ratio']:.2f}", f"{r['peak_mib']:.1f}",
              "n/a" if r["peak_ratio"] is None else f"{r['peak_ratio']:.2f}"] + o for r, o in zip(rows, ops)]
    return timing.table(head, lines, left=2)


def parse_args(argv=None) -> argparse.Namespace:
    p = timing.step_bench_parser(__doc__)
    p.add_argument("--compare-decoding", action="store_true",
                   help="also the transformer's soft beam on fairseq's incremental path, in the same run")
    p.add_argument("--child-model", help=argparse.SUPPRESS)
    p.add_argument("--child-row", help=argparse.SUPPRESS)
    return timing.quick_settings(p.parse_args(argv))


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child_model:
        child(args)
        return
    device = torch.device(args.device)
    rows = bench("tagging", args, device) + bench("transformer", args, device)
    timing.report(f"soft beam step / cross-entropy step, batch {args.batch_size}, device {device}, "
                  f"{args.threads} thread(s), median of {args.repeats}; peak memory of one step above the built "
                  "model and batch", format_table(rows), rows, args.json)


if __name__ == "__main__":
    main()
