"""Throughput of every translation criterion of the plugin relative to fairseq's
``cross_entropy``: one training step (forward + backward) on the same model and
batch, all timed in the same run (docs/performance.md).

Run: ``.venv/bin/python bench/bench_criteria.py`` (a few minutes on one CPU core;
with a CUDA device it runs on CUDA; ``--quick`` for a smoke run, ``--json FILE`` to
keep the rows).

Model: ``transformer`` (3+3 layers, embed 256, ffn 1024, 4 heads; ``--quick``: the
tiny one), random weights, train mode, on the toy translation corpus; batch of
the first B sentences; ``--arch lstm``: fairseq's ``lstm`` instead, 1+1 layers of 256
units (the thesis's MT size, as in ``bench_dss.py``). ``--size iwslt``: the size users train instead, the
``transformer_iwslt_de_en`` shape (6+6 layers, embed 512, ffn 1024, 4 heads) on a
batch of about ``--batch-tokens`` tokens (4,096: the first sentences until the
longer side of each, summed, reaches it), meant for a GPU. On CUDA every row's peak
memory above the model's is reported (one extra call, statistics reset before it). Rows, each with its training settings of the docs:
``ce`` (ratio 1), ``self_normalized_ce``, ``dss soft-argmax`` (eps = 0: every
position fed the relaxed decision, the worst case), ``soft_beam_direct_loss`` and
``soft_beam_hinge`` (k = 3), ``mrt`` (4 samples), ``pg`` (4 samples, self-critical
greedy baseline), ``mgs`` (K = 4 candidates, greedy decoding). Time: ``--warmup``
untimed rounds, ``--repeats`` interleaved rounds, median, wall clock. ``--amp``: every
step (CE's too) under ``torch.autocast`` (float16 on CUDA, bfloat16 on the CPU), as
fairseq's ``--amp`` runs the forward and backward; without a loss scaler, which only
multiplies. ``--compare-decoding``: each row that decodes (dss, the soft beam, mrt, pg, mgs) is also
measured with fairseq's incremental decoding (the criterion built with ``--decoding-path
fairseq``; MGS's candidates then one at a time), the path the static-cache step replaced,
in the same run. ``--compile``: also ``dss soft-argmax, compiled step`` (``--dss-compile on``: the exact
pass's step compiled by torch.compile) and ``soft_beam_direct_loss k=3, compiled steps``
(``--soft-beam-compile on``: the search's decoder step and soft beam step compiled); their
compiling, minutes on a small CPU, happens in the warm-up rounds, and their operator counts
include the calls of the kernels inductor generated.
Printed, never asserted. ``residual_nce`` (another task and model) is measured by
``bench_residual.py``.
"""
import contextlib
import copy
import functools
import logging
import os
import tempfile
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _name in ("fairseq", "fairseq_cli", "filelock"):  # filelock: inductor's cache, with --compile
    logging.getLogger(_name).setLevel(logging.WARNING)


import torch
from fairseq import options, utils

from fairseq_ext.synthetic import tiny_models, toy

import timing  # bench/timing.py, beside this script

ROWS = {
    "ce": ["--criterion", "cross_entropy"],
    "self_normalized_ce": ["--criterion", "self_normalized_ce"],
    "dss soft-argmax": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule", "always",
                        "--dss-warmup", "0"],
    "soft_beam_direct_loss k=3": ["--criterion", "soft_beam_direct_loss", "--soft-beam-size", "3"],
    "soft_beam_hinge k=3": ["--criterion", "soft_beam_hinge", "--soft-beam-size", "3"],
    "mrt 4 samples": ["--criterion", "mrt", "--mrt-candidates", "4", "--mrt-task-loss", "edit"],
    "pg 4 samples": ["--criterion", "pg", "--pg-samples", "4", "--pg-task-loss", "edit", "--pg-baseline", "greedy"],
    "mgs K=4": ["--criterion", "mgs", "--mgs-candidates", "4", "--mgs-task-loss", "edit"],
}


# transformer_iwslt_de_en's shape, as overrides of tiny_models.TINY_ARCHS["transformer"]
IWSLT = ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "512", "--decoder-embed-dim", "512",
         "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4"]


def build(data: str, quick: bool, device: torch.device, size: str = "small", model_arch: str = "transformer"):
    """(task, model, the criterions of ROWS) sharing one task and model."""
    if model_arch == "lstm":
        arch = [] if quick else timing.LSTM
    else:
        arch = [] if quick else (IWSLT if size == "iwslt" else timing.TRANSFORMER)
    task, model, _ = tiny_models.build_task_and_model(data, "translation", model_arch, arch + ["--dropout", "0.1"])
    crits = {row: criterion(data, task, row, model_arch) for row in ROWS}
    return task, model.to(device).train(), crits


def criterion(data: str, task, row: str, model_arch: str, extra=()):
    """The criterion of ``row``, built by fairseq from its command line (and ``extra``)."""
    argv = [data, "--task", "translation", "--user-dir", os.path.join(REPO, "fairseq_ext")]
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       argv + tiny_models.TINY_ARCHS[model_arch] + ROWS[row] + list(extra))
    return task.build_criterion(args)


DECODING_ROWS = ("dss soft-argmax", "soft_beam_direct_loss k=3", "soft_beam_hinge k=3", "mrt 4 samples",
                 "pg 4 samples", "mgs K=4")


def fairseq_decoding(data: str, task, row: str, model_arch: str):
    """The criterion of ``row`` built with ``--decoding-path fairseq`` (MGS: its candidates
    then one at a time, as it says in the log)."""
    return criterion(data, task, row, model_arch, ["--decoding-path", "fairseq"])




COMPILED_ROWS = {"dss soft-argmax": "dss soft-argmax, compiled step",
                 "soft_beam_direct_loss k=3": "soft_beam_direct_loss k=3, compiled steps"}


def compiled_step(criterion):
    """A copy of ``criterion`` (DSS, the soft beam) that runs its steps compiled (``--dss-compile on``,
    ``--soft-beam-compile on``)."""
    other = copy.copy(criterion)
    other.compiled = True
    return other


def step(model, sample, criterion, autocast=contextlib.nullcontext) -> None:
    model.zero_grad(set_to_none=True)
    with autocast():
        loss, _, _ = criterion(model, sample)
    loss.backward()


def bench(args, device: torch.device) -> List[Dict]:
    with tempfile.TemporaryDirectory() as tmp:
        n = max(64, args.batch_size) if args.size == "small" else max(64, args.batch_tokens // 4)
        raw = toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(n, 10, 10))
        data = toy.binarize_translation(raw, os.path.join(tmp, "bin"))
        task, model, crits = build(data, args.quick, device, args.size, args.arch)
        task.load_dataset("train")
        ds = task.dataset("train")
        if args.size == "iwslt":  # the first sentences up to --batch-tokens (fairseq's --max-tokens measure)
            tokens, args.batch_size = 0, 0
            while args.batch_size < len(ds) and tokens < args.batch_tokens:
                tokens += max(ds.src_sizes[args.batch_size], ds.tgt_sizes[args.batch_size])
                args.batch_size += 1
        sample = utils.apply_to_sample(lambda t: t.to(device), ds.collater([ds[i] for i in range(args.batch_size)]))
        autocast = contextlib.nullcontext if not args.amp else functools.partial(
            torch.autocast, device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16)
        fns = {row: (lambda c: lambda: step(model, sample, c, autocast))(c) for row, c in crits.items()}
        if args.compare_decoding:
            for row in DECODING_ROWS:
                fns[f"{row}, fairseq decoding"] = (lambda c: lambda: step(model, sample, c, autocast))(
                    fairseq_decoding(data, task, row, args.arch))
        for row, name in COMPILED_ROWS.items() if args.compile else ():
            fns[name] = (lambda c: lambda: step(model, sample, c, autocast))(compiled_step(crits[row]))
        ms, _ = timing.interleaved(fns, args.warmup, args.repeats, device)
        peak = {row: timing.peak_mib(fn, device) for row, fn in fns.items()}
        rows = [{"row": row, "ms": ms[row], "ratio": ms[row] / ms["ce"], "batch_size": args.batch_size,
                 "size": args.size, "device": str(device), "amp": args.amp, "peak_mib": peak[row],
                 "peak_ratio": peak[row] / peak["ce"] if peak[row] is not None else None} for row in fns]
        if args.op_counts:
            timing.op_counts(fns, rows)
    return rows



def main(argv=None) -> None:
    parser = timing.step_bench_parser(__doc__)
    parser.add_argument("--amp", action="store_true", help="every step under torch.autocast (fairseq's --amp)")
    parser.add_argument("--size", choices=["small", "iwslt"], default="small",
                        help="small: 3+3 x 256, batch --batch-size; iwslt: transformer_iwslt_de_en's shape, batch "
                             "--batch-tokens")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="--size iwslt: tokens a batch (about)")
    parser.add_argument("--arch", choices=["transformer", "lstm"], default="transformer",
                        help="lstm: fairseq's lstm, 1+1 layers of 256 units (the thesis's MT size; --size small only)")
    parser.add_argument("--compare-decoding", action="store_true",
                        help="also measure the rows that decode with fairseq's incremental decoding "
                             "(--decoding-path fairseq), in the same run")
    parser.add_argument("--compile", action="store_true",
                        help="also measure dss and the soft beam's direct loss with their steps compiled by "
                             "torch.compile (--dss-compile on, --soft-beam-compile on; minutes of compiling in the "
                             "warm-up)")
    args = timing.quick_settings(parser.parse_args(argv))
    if args.compile:
        timing.count_compiled_kernels()
    if args.arch == "lstm" and args.size != "small":
        parser.error("--arch lstm has one size: --size small")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(1)
    rows = bench(args, device)
    mem = device.type == "cuda"
    ops_head, ops = timing.op_columns(rows)
    timing.report(f"training step of each criterion / cross-entropy step, {args.arch} ({args.size}), batch "
                  f"{args.batch_size}, device {device}{', autocast' if args.amp else ''}, {args.threads} thread(s), "
                  f"median of {args.repeats}",
                  timing.table(["row", "ms / step", "ratio to ce"] + ops_head
                               + (["peak MiB", "peak / ce"] if mem else []),
                               [[r["row"], f"{r['ms']:.1f}", f"{r['ratio']:.2f}"] + o
                                + ([f"{r['peak_mib']:.0f}", f"{r['peak_ratio']:.2f}"] if mem else [])
                                for r, o in zip(rows, ops)]), rows, args.json)


if __name__ == "__main__":
    main()
