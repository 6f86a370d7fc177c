"""What the plugin's criterions log the same way: sums over the logging outputs of the
workers and micro-batches (``summed``); fairseq's cross-entropy metrics (``loss`` per
sample-size unit and ``nll_loss`` per target token, both in bits, and ``ppl``), which
fairseq's ``cross_entropy`` criterion logs; and the shape of decoded candidates (length
ratio to the references, repeated 4-grams), the seconds their costs took, and
per-sentence means."""
import math
from typing import Dict, List, Sequence, Tuple

from fairseq import metrics, utils
from torch import Tensor

from fairseq_ext.core.token_costs import unique_ngram_share


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


REPEAT_N = 4  # the n of the logged repetition rate (rep4)


def output_shape(hyps: List[Tensor], source_index: Tensor, refs: List[Tensor], special: Tuple[int, ...],
                 prefix: str = "") -> Dict[str, float]:
    """Logged sums that show length hacking and loops in decoded outputs: ``{prefix}hyp_len``
    (tokens of the hypotheses), ``{prefix}ref_len`` (tokens of the reference each answers;
    hypothesis j answers ``refs[source_index[j]]``), ``{prefix}rep4_sum`` (the sum over the
    hypotheses of 1 - their share of unique 4-grams, the ``rep`` cost) and ``{prefix}hyps``.
    Tokens in ``special`` (EOS, padding) are not counted. ``log_output_shape`` turns them into
    ``{prefix}len_ratio`` = hyp_len / ref_len and ``{prefix}rep4`` = rep4_sum / hyps."""
    def plain(t: Tensor) -> List[int]:
        return [x for x in t.tolist() if x not in special]

    hyps_plain = [plain(h) for h in hyps]
    ref_lengths = [len(plain(r)) for r in refs]
    rep = sum(1.0 - unique_ngram_share([h], REPEAT_N) for h in hyps_plain)
    return {f"{prefix}hyp_len": float(sum(len(h) for h in hyps_plain)),
            f"{prefix}ref_len": float(sum(ref_lengths[i] for i in source_index.tolist())),
            f"{prefix}rep4_sum": rep, f"{prefix}hyps": float(len(hyps))}


def candidate_shape(cand, batch: Dict, dictionary, prefix: str = "") -> Dict[str, float]:
    """``output_shape`` of decoded candidates (``decoding.candidates.Candidates``) against the
    references of the batch they were decoded for."""
    pad = dictionary.pad()
    refs = [utils.strip_pad(t, pad) for t in batch["target"]]
    return output_shape(cand.as_list(), cand.source_index, refs, (dictionary.eos(), pad), prefix)


def log_output_shape(logging_outputs, prefix: str = "") -> None:
    """fairseq metrics ``{prefix}len_ratio`` and ``{prefix}rep4`` from ``output_shape``'s sums
    (summed over micro-batches and workers first)."""
    def total(key):
        return summed(logging_outputs, prefix + key)

    hyps, ref_len = total("hyps"), total("ref_len")
    if hyps > 0 and ref_len > 0:
        metrics.log_scalar(f"{prefix}len_ratio", total("hyp_len") / ref_len, ref_len, round=4)
        metrics.log_scalar(f"{prefix}rep4", total("rep4_sum") / hyps, hyps, round=4)


def log_cost_seconds(logging_outputs) -> None:
    """fairseq metric ``cost_seconds``: seconds of task-loss computation per update, summed over
    micro-batches and workers (what the metric costs; decoding not included)."""
    if any("cost_seconds" in log for log in logging_outputs):
        metrics.log_scalar("cost_seconds", summed(logging_outputs, "cost_seconds"), round=3)


def log_sentence_means(logging_outputs, keys) -> None:
    """fairseq metrics: each key's sum over the logging outputs / number of sentences."""
    n = summed(logging_outputs, "nsentences")
    if n == 0:
        return
    for key in keys:
        metrics.log_scalar(key, summed(logging_outputs, key) / n, n, round=4)


def term_sums(per_name: Dict[str, Tensor], log_names: Dict[str, str], rows: int = None) -> Dict[str, float]:
    """``cost_{term}_sum``: each term's summed cost over the hypotheses (its first ``rows``), and
    ``term_hyps``, their number, for ``log_term_means``; ``log_names``: the scorer's key of each term."""
    out = {f"cost_{log_names[name]}_sum": float(c[:rows].sum()) for name, c in per_name.items()}
    out["term_hyps"] = float(next(iter(per_name.values()))[:rows].numel()) if per_name else 0.0
    return out


def log_term_means(logging_outputs) -> None:
    """fairseq metrics ``cost_{term}``: each term of a weighted cost, its mean over the hypotheses
    (``term_sums`` summed, over ``term_hyps``), logged every update beside the length ratio and rep4."""
    hyps = summed(logging_outputs, "term_hyps")
    if hyps <= 0:
        return
    keys = sorted({k for log in logging_outputs for k in log if k.startswith("cost_") and k.endswith("_sum")})
    for key in keys:
        metrics.log_scalar(key[: -len("_sum")], summed(logging_outputs, key) / hyps, hyps, round=4)
