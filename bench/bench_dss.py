"""Cost of one ``--criterion differentiable_scheduled_sampling`` training step,
as a ratio to a cross-entropy step on the same batch and model, measured in the
same run.

Run: ``.venv/bin/python bench/bench_dss.py`` (about a minute on one CPU core;
``--quick`` for a few-second smoke run, ``--json FILE`` to keep the rows).

Data: the embedded toy corpus (``fairseq_ext.synthetic.toy``) binarized in a temp dir; the
batch is the first B training pairs (targets of about 10 tokens: the sequential
mode's cost grows with the target length T, the P-pass mode's does not).

Models (train mode, dropout 0.1, random weights): ``transformer`` 3+3 layers,
embed 256, ffn 1024, 4 heads; ``lstm`` 1+1 layers, embed and hidden 256 (the
thesis's MT sizes, section 3.3.3).

Rows, each a forward and backward on the batch:

- ``ce``: fairseq's ``cross_entropy`` criterion (the baseline, ratio 1);
- ``dss soft-argmax`` / ``dss hard-argmax``: our criterion with eps = 0 (every
  position after the first is model-fed: the most expensive case), exact
  left-to-right decoding through the incremental state (T decoder calls);
- ``dss soft-argmax P=2`` / ``P=3``: the parallel approximation (P full passes).

Timing: ``--warmup`` untimed rounds, then ``--repeats`` interleaved rounds (the
order alternates), median per row; wall clock; ``torch.set_num_threads(--threads)``.
Ratios are printed, never asserted.
"""
import argparse
import logging
import os
import tempfile
from typing import Dict, List

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq import utils
from fairseq.criterions.cross_entropy import CrossEntropyCriterion

from fairseq_ext.synthetic import tiny_models, toy
from fairseq_ext.criterions.scheduled_sampling import DSSCriterion

import timing  # bench/timing.py, beside this script

ARCHS = {
    "transformer": ["--arch", "transformer", *timing.TRANSFORMER],
    "lstm": ["--arch", "lstm", *timing.LSTM],
}
QUICK_ARCHS = {name: tiny_models.TINY_ARCHS[name] for name in ARCHS}
VARIANTS = [("dss soft-argmax", "soft-argmax", 0), ("dss hard-argmax", "hard-argmax", 0),
            ("dss soft-argmax P=2", "soft-argmax", 2), ("dss soft-argmax P=3", "soft-argmax", 3)]


def step(model, sample: Dict, criterion) -> None:
    model.zero_grad(set_to_none=True)
    loss, _, _ = criterion(model, sample)
    loss.backward()


def bench_arch(data: str, arch: str, arch_args: List[str], args, device: torch.device) -> List[Dict]:
    # the tiny arch's options overridden by ``arch_args`` (argparse: the last value wins)
    task, model, _ = tiny_models.build_task_and_model(data, "translation", arch, arch_args, seed=args.seed)
    model = model.to(device).train()
    task.load_dataset("train")
    ds = task.dataset("train")
    sample = utils.apply_to_sample(lambda t: t.to(device), ds.collater([ds[i] for i in range(args.batch_size)]))
    fns = {"ce": lambda: step(model, sample, CrossEntropyCriterion(task, sentence_avg=False))}
    for name, mode, passes in VARIANTS:
        crit = DSSCriterion(task, dss_mode=mode, dss_schedule="always", dss_warmup=0.0,
                                               dss_passes=passes)
        fns[name] = (lambda c: lambda: step(model, sample, c))(crit)
    ms, _ = timing.interleaved(fns, args.warmup, args.repeats, device)
    target_len = float(sample["target"].ne(task.target_dictionary.pad()).sum(1).float().mean())
    rows = [{"arch": arch, "row": name, "ms": ms[name], "ratio": ms[name] / ms["ce"], "batch_size": args.batch_size,
             "mean_target_len": target_len, "max_target_len": int(sample["target"].size(1))} for name in fns]
    if args.op_counts:
        timing.op_counts(fns, rows)
    return rows


def format_table(rows: List[Dict]) -> str:
    ops_head, ops = timing.op_columns(rows)
    head = ["arch", "row", "ms / step", "ratio to ce"] + ops_head
    lines = [[r["arch"], r["row"], f"{r['ms']:.1f}", f"{r['ratio']:.2f}"] + o for r, o in zip(rows, ops)]
    return timing.table(head, lines, left=2)


def parse_args(argv=None) -> argparse.Namespace:
    p = timing.step_bench_parser(__doc__)
    p.add_argument("--seed", type=int, default=1)
    return timing.quick_settings(p.parse_args(argv))


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        raw = toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(max(64, args.batch_size), 10, 10))
        data = toy.binarize_translation(raw, os.path.join(tmp, "bin"))
        rows = []
        for arch, arch_args in (QUICK_ARCHS if args.quick else ARCHS).items():
            rows += bench_arch(data, arch, arch_args, args, device)
    timing.report(f"DSS step time / cross-entropy step time, batch {args.batch_size}, "
                  f"mean target length {rows[0]['mean_target_len']:.1f} (max {rows[0]['max_target_len']}), "
                  f"device {device}, {args.threads} thread(s), median of {args.repeats}", format_table(rows), rows,
                  args.json)


if __name__ == "__main__":
    main()
