"""Timing helpers shared by the benchmarks: interleaved repeated calls, medians.

A benchmark compares functions timed in the same run; calling them in alternating
order (ABBA...) spreads slow drifts of a shared machine's load over all of them."""
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch

CLOCKS = {"process": time.process_time, "wall": time.perf_counter}


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
