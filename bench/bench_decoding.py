"""Candidate decoding speed (and GPU memory): ``decode_candidates`` (the static-cache
step where the model allows it), the same with fairseq's incremental decoding
(``DecodeConfig.path = "fairseq"``), and fairseq's ``SequenceGenerator``, all measured in
the same run on the same models and batches.

Run: ``.venv/bin/python bench/bench_decoding.py`` (about 2 minutes on one CPU core;
``--quick`` for a few-second smoke run, ``--json FILE`` to keep the rows).

Models: a ``transformer`` (3+3 layers, embed 256, ffn 1024, 4 heads) and an ``lstm``
(2+2 layers, 256 units) on the toy translation task, and a ``transformer_lm`` (3 layers,
embed 256) on ``text_completion`` (``--completion-context-size 3``: the decoder continues a
3-token prompt). Data: the embedded toy corpus (``fairseq_ext.synthetic.toy``) in a temp dir.
Weights are random (untrained), so two output regimes are measured:

- ``max-len``: the untrained model as built. It almost never emits EOS, so nearly
  every row runs to the length limit: the worst case for both decoders.
- ``early-stop``: a copy whose EOS row of the output projection is replaced by a
  linear probe of the decoding step (least squares on the hidden states of this
  model's own untrained greedy run), scaled by 0.1 and offset so that the mean greedy
  length is about half the limit. All other logits are unchanged, so rows decode
  as before until EOS wins, which happens at different steps for different rows
  (the table reports the mean length and the fraction of rows that ended with EOS).

Settings, for every model, regime and batch size B (``--batch-sizes``: decoded rows):

- ``greedy`` (B inputs): ``decode_candidates(model, sample, DecodeConfig(max_len_b=L))``
  against ``SequenceGenerator([model], tgt_dict, beam_size=1, max_len_a=0,
  max_len_b=L)``; ms per batch. "identical" compares the tokens row by row
  (SequenceGenerator appends a forced EOS to a row that reaches the limit, and so runs
  one more decoder step on such rows; the comparison ignores that EOS). A mismatch is
  reported with its count and how many of those rows are ours = EOS alone (both
  decoders default to ``min_len=1``, which bans EOS at the first step).
- ``sample`` (B/4 inputs x 4 candidates = B rows), top-10 sampling:
  ``DecodeConfig(strategy="sample", num_candidates=4, topk=10)`` against
  ``SequenceGenerator`` with ``search.Sampling(sampling_topk=10)`` and ``beam_size=4``
  (one sample per beam slot, so 4 per input; both ban EOS at the first step);
  ms per returned candidate. Draws differ, so tokens are not compared.

For the language model both decoders get the prompt as ``prefix_tokens`` (the
SequenceGenerator limit is L + prompt length, so both generate at most L new tokens).
"incremental" is ``decode_candidates`` with ``path="fairseq"``: the path the static-cache
steps replaced (``TransformerStep``, the ``lstm``'s ``LSTMStep``); its tokens are
compared with ours ("= inc": the same tokens, also when sampling, since both draw the
same random numbers for the same rows). tok/s: generated tokens (EOS included) per second of ours.
Timing: ``time.perf_counter`` around one call, ``--warmup`` untimed calls then
``--repeats`` timed ones, the three decoders interleaved (alternating the order),
the median reported; ``torch.set_num_threads(--threads)``, eval mode, ``no_grad``.
The ratio column is SequenceGenerator / ours: above 1 means ours is faster.
Memory: peak ``torch.cuda.max_memory_allocated`` above the model's own allocation
(one extra call per decoder, stats reset in between), on CUDA only: on CPU torch's
allocations are invisible to ``tracemalloc`` and max RSS is process-wide and never
decreases, so no honest per-call figure exists and the column says n/a.
Timings are printed, never asserted.
"""
import argparse
import copy
import dataclasses
import json
import logging
import os
import statistics
import tempfile
from typing import Dict, List, Optional, Tuple

for _name in ("fairseq", "fairseq_cli"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import torch
from fairseq import search, utils
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext.synthetic import tiny_models, toy
from fairseq_ext.decoding.candidates import Candidates, DecodeConfig, decode_candidates
from fairseq_ext.decoding.candidates import prefix_sample

import timing  # bench/timing.py, beside this script

# appended after tiny_models.TINY_ARCHS[arch]: argparse keeps the last value of a repeated option
MODERATE_ARCHS = {
    "transformer": timing.TRANSFORMER,
    "lstm": ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256",
             "--decoder-embed-dim", "256", "--encoder-hidden-size", "256", "--decoder-hidden-size", "256",
             "--decoder-out-embed-dim", "256"],
    "transformer_lm": ["--decoder-layers", "3", "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024",
                       "--decoder-attention-heads", "4"],
}
NUM_SAMPLES = 4
SAMPLE_TOPK = 10
EOS_PROBE_SCALE = 0.1


def build_models(tmp: str, quick: bool) -> List[Tuple[str, object, object]]:
    """(arch, task, model) for the three architectures, on freshly binarized toy data."""
    raw = toy.write_toy_data(os.path.join(tmp, "raw"), sizes=(300, 80, 10) if quick else (500, 200, 10))
    mt_bin = toy.binarize_translation(raw, os.path.join(tmp, "mt_bin"))
    lm_bin = toy.binarize_lines(raw, os.path.join(tmp, "lm_bin"))
    out = []
    for arch, data, task_name in (("transformer", mt_bin, "translation"), ("lstm", mt_bin, "translation"),
                                  ("transformer_lm", lm_bin, "text_completion")):
        extra = [] if quick else list(MODERATE_ARCHS[arch])
        if task_name == "text_completion":
            extra += ["--completion-context-size", "3"]
        task, model, _ = tiny_models.build_task_and_model(data, task_name, arch, extra)
        task.load_dataset("valid")
        out.append((arch, task, model.eval()))
    return out


def make_batch(task, n: int, device: torch.device) -> Tuple[Dict, Optional[torch.Tensor]]:
    """The first n validation items as the decoders see them, and the prompt (LM only)."""
    ds = task.dataset("valid")
    if len(ds) < n:
        raise ValueError(f"batch size {n} exceeds the {len(ds)} toy validation items")
    sample = ds.collater([ds[i] for i in range(n)])
    if "prefix" in sample:
        d = task.target_dictionary
        sample = prefix_sample(sample, d.pad(), d.eos())
    sample = utils.apply_to_sample(lambda t: t.to(device), sample)
    return sample, sample.get("prefix")


def _output_layer_name(model) -> str:
    return "fc_out" if hasattr(model.decoder, "fc_out") else "output_projection"


def early_stopping_copy(model, sample: Dict, prefix: Optional[torch.Tensor], max_len: int):
    """A copy of ``model`` whose EOS logit is 0.1 * (probe(h_t) - t0): probe(h) is a
    least-squares estimate of the decoding step from the output layer's input h,
    fitted on the model's own greedy run over ``sample``; t0 is set by bisection so
    that the mean greedy length on ``sample`` is about max_len / 2."""
    name = _output_layer_name(model)
    feats: List[torch.Tensor] = []
    hook = getattr(model.decoder, name).register_forward_hook(
        lambda mod, inp, out: feats.append(inp[0].reshape(-1, inp[0].size(-1)).float())
    )
    try:
        decode_candidates(model, sample, DecodeConfig(max_len_b=max_len), prefix_tokens=prefix)
    finally:
        hook.remove()
    h = torch.cat(feats)
    h1 = torch.cat([h, h.new_ones(h.size(0), 1)], dim=1)
    step = torch.cat([h.new_full((f.size(0), 1), float(i)) for i, f in enumerate(feats)])
    probe = torch.linalg.lstsq(h1.cpu(), step.cpu()).solution.squeeze(1).to(h.device)

    copy_ = copy.deepcopy(model)
    old = getattr(copy_.decoder, name)
    new = torch.nn.Linear(old.in_features, old.out_features, bias=True).to(old.weight)
    eos = copy_.decoder.dictionary.eos()
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.copy_(old.bias if old.bias is not None else torch.zeros_like(new.bias))
        new.weight[eos] = EOS_PROBE_SCALE * probe[:-1]
    setattr(copy_.decoder, name, new)

    def mean_length(t0: float) -> float:
        with torch.no_grad():
            new.bias[eos] = EOS_PROBE_SCALE * (probe[-1] - t0)
        cand = decode_candidates(copy_, sample, DecodeConfig(max_len_b=max_len), prefix_tokens=prefix)
        return float(cand.lengths.float().mean())

    lo, hi = -3.0 * max_len, 2.0 * max_len
    for _ in range(10):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mean_length(mid) > max_len / 2 else (mid, hi)
    mean_length((lo + hi) / 2)
    return copy_.eval()


def sg_rows(hypos, k: int, max_len: int, eos: int) -> List[Tuple[torch.Tensor, bool]]:
    """SequenceGenerator output as (generated tokens without the prompt and without a
    forced EOS at the limit, ended-with-EOS) per returned hypothesis."""
    rows = []
    for nbest in hypos:
        for h in nbest:
            tok = h["tokens"][k:]
            done = len(tok) <= max_len and int(tok[-1]) == eos
            rows.append((tok if done else tok[:max_len], done))
    return rows


def greedy_mismatches(cand: Candidates, rows: List[Tuple[torch.Tensor, bool]], eos: int) -> Tuple[int, int]:
    """(rows whose greedy tokens differ, how many of those are ours = EOS alone)."""
    if len(rows) != cand.tokens.size(0):
        return cand.tokens.size(0), 0
    bad = [mine for mine, fin, (ref, done) in zip(cand.as_list(), cand.finished.tolist(), rows)
           if not (torch.equal(mine, ref) and bool(fin) == done)]
    return len(bad), sum(1 for mine in bad if mine.tolist() == [eos])


def bench_setting(model, tgt_dict, sample, prefix, strategy: str, max_len: int, args, device) -> Dict:
    k = prefix.size(1) if prefix is not None else 0
    eos = tgt_dict.eos()
    if strategy == "greedy":
        cfg = DecodeConfig(max_len_b=max_len)
        sg = SequenceGenerator([model], tgt_dict, beam_size=1, max_len_a=0, max_len_b=max_len + k)
    else:
        cfg = DecodeConfig(strategy="sample", num_candidates=NUM_SAMPLES, topk=SAMPLE_TOPK, max_len_b=max_len)
        sg = SequenceGenerator([model], tgt_dict, beam_size=NUM_SAMPLES, max_len_a=0, max_len_b=max_len + k,
                               search_strategy=search.Sampling(tgt_dict, sampling_topk=SAMPLE_TOPK))
    gen = torch.Generator(device=device)
    inc_cfg = dataclasses.replace(cfg, path="fairseq")

    def ours():
        gen.manual_seed(args.seed)
        return decode_candidates(model, sample, cfg, prefix_tokens=prefix, generator=gen)

    def incremental():
        gen.manual_seed(args.seed)
        return decode_candidates(model, sample, inc_cfg, prefix_tokens=prefix, generator=gen)

    def theirs():
        torch.manual_seed(args.seed)
        with torch.no_grad():
            return sg.generate([model], sample, prefix_tokens=prefix)

    fns = {"ours": ours, "inc": incremental, "sg": theirs}
    ms, out = timing.interleaved(fns, args.warmup, args.repeats, device)
    cand, rows = out["ours"], sg_rows(out["sg"], k, max_len, eos)
    same_as_inc = torch.equal(cand.tokens, out["inc"].tokens) and torch.equal(cand.lengths, out["inc"].lengths)
    tok_per_s = float(cand.lengths.sum()) / (ms["ours"] / 1000)
    n_ours, n_sg = cand.tokens.size(0), len(rows)
    mismatched = greedy_mismatches(cand, rows, eos) if strategy == "greedy" else (0, 0)
    ours_ms, inc_ms, sg_ms = ms["ours"], ms["inc"], ms["sg"]
    if strategy == "sample":  # per returned candidate
        ours_ms, inc_ms, sg_ms = ours_ms / n_ours, inc_ms / n_ours, sg_ms / n_sg
    mem_ours, mem_sg = timing.peak_mib(ours, device), timing.peak_mib(theirs, device)
    return {
        "strategy": strategy,
        "ours_ms": ours_ms,
        "inc_ms": inc_ms,
        "sg_ms": sg_ms,
        "speedup": sg_ms / ours_ms,
        "speedup_vs_incremental": inc_ms / ours_ms,
        "same_as_incremental": same_as_inc,
        "tok_per_s": tok_per_s,
        "ms_unit": "per batch" if strategy == "greedy" else "per candidate",
        "identical": mismatched[0] == 0 if strategy == "greedy" else None,
        "mismatched_rows": mismatched[0],
        "mismatched_rows_ours_eos_only": mismatched[1],
        "candidates": [n_ours, n_sg],
        "mean_len": [float(cand.lengths.float().mean()), statistics.mean(len(t) for t, _ in rows)],
        "eos_frac": [float(cand.finished.float().mean()), statistics.mean(float(d) for _, d in rows)],
        "peak_mib": [mem_ours, mem_sg],
        "mem_ratio": mem_sg / mem_ours if mem_ours else None,
    }


def bench_model(arch: str, task, model, args, device: torch.device) -> List[Dict]:
    """All settings (regime x batch size x strategy) for one model."""
    model.to(device)
    sample, prefix = make_batch(task, min(args.batch_sizes), device)
    regimes = {"max-len": model, "early-stop": early_stopping_copy(model, sample, prefix, args.max_len)}
    n_params = sum(p.numel() for p in model.parameters())
    prompt = f", prompt {prefix.size(1)} tokens" if prefix is not None else ""
    print(f"{arch}: {n_params / 1e6:.2f}M parameters{prompt}", flush=True)
    rows = []
    for regime, m in regimes.items():
        for bsz in args.batch_sizes:
            for strategy, n in (("greedy", 1), ("sample", NUM_SAMPLES)):
                inputs = max(1, bsz // n)  # B decoded rows either way
                sample, prefix = make_batch(task, inputs, device)
                row = bench_setting(m, task.target_dictionary, sample, prefix, strategy, args.max_len, args, device)
                rows.append({"model": arch, "regime": regime, "inputs": inputs, "num_candidates": n,
                             "max_len": args.max_len, **row})
    return rows


def format_table(rows: List[Dict], device: torch.device) -> str:
    head = ["model", "regime", "decoding", "inputs x n", "ours ms", "inc ms", "inc/ours", "= inc", "SG ms", "SG/ours",
            "ours tok/s", "identical", "mean len ours/SG", "EOS % ours/SG", "peak MiB ours/SG (SG/ours)"]
    lines = []
    for r in rows:
        mem = "n/a on CPU" if device.type != "cuda" else (
            f"{r['peak_mib'][0]:.1f}/{r['peak_mib'][1]:.1f} ({r['mem_ratio']:.2f}x)" if r["mem_ratio"] else "n/a"
        )
        ident = {True: "yes", False: "no", None: "n/a (random)"}[r["identical"]]
        if r["identical"] is False:
            bad, n, eos_only = r["mismatched_rows"], r["candidates"][0], r["mismatched_rows_ours_eos_only"]
            ident += f" ({bad}/{n} rows, {eos_only} EOS-only)"
        dec = "greedy" if r["strategy"] == "greedy" else f"sample top-{SAMPLE_TOPK} (ms/cand)"
        lines.append([r["model"], r["regime"], dec, f"{r['inputs']}x{r['num_candidates']}", f"{r['ours_ms']:.2f}",
                      f"{r['inc_ms']:.2f}", f"{r['speedup_vs_incremental']:.2f}x",
                      "yes" if r["same_as_incremental"] else "no", f"{r['sg_ms']:.2f}",
                      f"{r['speedup']:.2f}x", f"{r['tok_per_s']:.0f}", ident, "{:.1f}/{:.1f}".format(*r["mean_len"]),
                      "{:.0f}/{:.0f}".format(*(100 * x for x in r["eos_frac"])), mem])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*head), sep] + [fmt.format(*line) for line in lines])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, for stable numbers)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64])
    p.add_argument("--max-len", type=int, default=50, help="L: at most L generated tokens per row")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per decoder and setting (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per decoder and setting")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true",
                   help="tiny models, B=4, L=8, one repeat, no warm-up: a few seconds (smoke test)")
    p.add_argument("--json", metavar="FILE", help="also write the settings and rows as JSON")
    a = p.parse_args(argv)
    if a.quick:
        a.batch_sizes, a.max_len, a.repeats, a.warmup = [4], 8, 1, 0
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    return a


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(tmp, args.quick)
        print(f"device {device}, threads {args.threads}, L={args.max_len}, warm-up {args.warmup}, "
              f"median of {args.repeats}, torch {torch.__version__}")
        for arch, task, model in models:
            rows += bench_model(arch, task, model, args, device)
    print()
    print(format_table(rows, device))
    print()
    print("max-len: untrained weights, rows rarely emit EOS (worst case). early-stop: EOS logit from a linear\n"
          "probe of the step, so rows end at different steps (greedy mean ~L/2). inputs x n: sources x candidates\n"
          "each. ms: greedy per batch, sample per candidate. inc: fairseq's incremental path (path='fairseq'); = inc:\n"
          "the same tokens as it. SG/ours > 1: ours faster. identical: greedy tokens equal to SequenceGenerator's\n"
          "row by row; 'EOS-only': mismatched rows where ours is EOS alone (both use min_len=1).")
    if device.type != "cuda":
        print("memory: n/a on CPU (torch allocations are invisible to tracemalloc; max RSS is process-wide)")
    if args.json:
        meta = {"device": str(device), "threads": args.threads, "max_len": args.max_len, "repeats": args.repeats,
                "warmup": args.warmup, "quick": args.quick, "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump({"settings": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
