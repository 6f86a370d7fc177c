"""What the plugin's criterions log the same way: sums over the logging outputs of the
workers and micro-batches (``summed``), and fairseq's cross-entropy metrics (``loss`` per
sample-size unit and ``nll_loss`` per target token, both in bits, and ``ppl``), which
fairseq's ``cross_entropy`` criterion logs."""
import math
from typing import Sequence, Tuple

from fairseq import metrics, utils


def summed(logging_outputs: Sequence[dict], key: str) -> float:
    """The sum of ``key`` over the logging outputs (0 where absent), as a Python number."""
    return utils.item(sum(log.get(key, 0) for log in logging_outputs))


def log_cross_entropy(logging_outputs: Sequence[dict]) -> Tuple[float, float]:
    """Log fairseq's cross-entropy metrics from the summed ``loss``, ``nll_loss``,
    ``sample_size`` and ``ntokens``; returns (sample_size, ntokens)."""
    sample_size, ntokens = summed(logging_outputs, "sample_size"), summed(logging_outputs, "ntokens")
    metrics.log_scalar("loss", summed(logging_outputs, "loss") / max(sample_size, 1) / math.log(2), sample_size,
                       round=3)
    metrics.log_scalar("nll_loss", summed(logging_outputs, "nll_loss") / max(ntokens, 1) / math.log(2), ntokens,
                       round=3)
    metrics.log_derived("ppl", lambda m: utils.get_perplexity(m["nll_loss"].avg))
    return sample_size, ntokens
