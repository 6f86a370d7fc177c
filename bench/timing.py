"""Timing helpers shared by the benchmarks: interleaved repeated calls, medians.

A benchmark compares functions timed in the same run; calling them in alternating
order (ABBA...) spreads slow drifts of a shared machine's load over all of them."""
import json
import re
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch

CLOCKS = {"process": time.process_time, "wall": time.perf_counter}

# the step benchmarks' transformer (overrides of tiny_models.TINY_ARCHS["transformer"]): 3+3 layers, 256 / 1024, 4 heads
TRANSFORMER = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
               "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
               "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
# the lstm of the thesis's MT size: 1+1 layers of 256 units (bench_dss, bench_criteria --arch lstm)
LSTM = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
        "--encoder-hidden-size", "256", "--decoder-hidden-size", "256", "--decoder-out-embed-dim", "256"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    """ms of one call of ``fn`` on ``clock`` (CUDA synchronised before and after)."""
    sync(device)
    t = clock()
    fn()
    sync(device)
    return 1000 * (clock() - t)


def interleaved(fns: Dict[str, Callable], warmup: int, repeats: int, device: torch.device,
                clock: Callable[[], float] = time.perf_counter) -> Tuple[Dict[str, float], Dict[str, object]]:
    """Median ms of each function over ``repeats`` interleaved calls after ``warmup``
    untimed rounds (the order alternates every round), and each function's last
    return value."""
    times: Dict[str, List[float]] = {k: [] for k in fns}
    last: Dict[str, object] = {}
    names = list(fns)
    for r in range(warmup + repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            sync(device)
            t = clock()
            last[name] = fns[name]()
            sync(device)
            if r >= warmup:
                times[name].append(1000 * (clock() - t))
    return {k: statistics.median(v) for k, v in times.items()}, last


def table(head: List[str], lines: List[List[str]], left: int = 1) -> str:
    """A plain-text table: the first ``left`` columns left-aligned, the rest right."""
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]

    def fmt(row):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in lines])


def report(title: str, text: str, rows, json_path=None, indent: int = 2) -> None:
    """Print a benchmark's title line and table; write ``rows`` as JSON to ``json_path`` if given."""
    print(title)
    print(text)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=indent)


def step_bench_parser(doc: str):
    """The options shared by the step benchmarks (bench_dss, bench_soft_beam, bench_criteria)."""
    import argparse

    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny models, 1 warm-up and 2 repeats (smoke test)")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--op-counts", action="store_true",
                   help="also count the aten operator calls of one call of each row (torch.profiler): on a GPU a "
                        "small model's step is launch-bound, and these ratios predict its time ratios there")
    return p


def peak_mib(fn: Callable, device: torch.device):
    """Peak CUDA memory of one call of ``fn`` above what was allocated before it (MiB);
    None on other devices (on the CPU torch's allocations are invisible to tracemalloc,
    and max RSS is process-wide and never decreases)."""
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


# the kernels torch.compile's inductor generates, as the profiler names them: C++ kernels (recorded with
# torch._inductor.config.cpp.enable_kernel_profile, which ``count_compiled_kernels`` sets) and Triton ones
_COMPILED_KERNEL = re.compile(r"(graph_\d+_)?(cpp_fused|triton_)")


def count_compiled_kernels() -> None:
    """Have the C++ kernels inductor generates from now on record a profiler event each, for
    ``aten_calls`` to count (set before the first compile)."""
    import torch._inductor.config
    torch._inductor.config.cpp.enable_kernel_profile = True


def aten_calls(fn: Callable) -> int:
    """Operator calls (``aten::*`` events, nested ones included) of one call of ``fn``,
    recorded by torch.profiler on the CPU side, and the calls of the kernels compiled code
    runs instead of operators: a proxy for the kernel launches the call makes on a GPU."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages()
               if e.key.startswith("aten::") or _COMPILED_KERNEL.match(e.key))


def op_counts(fns: Dict[str, Callable], rows: List[Dict], ce: str = "ce") -> None:
    """``aten_calls`` of each row's function into its row (``aten_calls``, and ``calls_ratio``
    against row ``ce`` of the same group): for ``--op-counts``."""
    calls = {row: aten_calls(fn) for row, fn in fns.items()}
    for r in rows:
        if r["row"] in calls:
            r.update(aten_calls=calls[r["row"]], calls_ratio=calls[r["row"]] / calls[ce])


def op_columns(rows: List[Dict]) -> Tuple[List[str], List[List[str]]]:
    """The header and per-row cells of the operator-call columns (empty without counts)."""
    if not rows or "aten_calls" not in rows[0]:
        return [], [[] for _ in rows]
    return ["aten calls", "calls / ce"], [[str(r["aten_calls"]), f"{r['calls_ratio']:.2f}"] for r in rows]


def quick_settings(args):
    """--quick: 1 warm-up, 2 repeats, batch 8."""
    if args.quick:
        args.warmup, args.repeats, args.batch_size = 1, 2, 8
    return args
