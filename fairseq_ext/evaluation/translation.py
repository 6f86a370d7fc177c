"""Translation scores of decoded text: corpus BLEU (sacrebleu) and its breakdowns, mean
sentence BLEU, edit cost, rep-4, non-termination (``scripts/score.py`` prints them).

Per-sentence costs are the registered task losses of ``fairseq_ext.core.task_losses``,
so a score here is the cost a criterion trains on.
"""
from __future__ import annotations

from typing import Optional

import sacrebleu

from fairseq_ext.core import task_losses

_EOS = "</s>"


def remove_bpe(line: str, bpe_symbol: Optional[str]) -> str:
    """Undo subword segmentation as fairseq's ``--post-process`` does.

    ``sentencepiece``: drop spaces, then "▁" becomes a space; ``subword_nmt``
    means "@@ "; any other symbol is deleted together with a following space.
    """
    if bpe_symbol is None:
        return line
    if bpe_symbol == "sentencepiece":
        return line.replace(" ", "").replace("\u2581", " ").strip()
    if bpe_symbol == "subword_nmt":
        bpe_symbol = "@@ "
    return (line + " ").replace(bpe_symbol, "").rstrip()


def mean_cost(name: str, hyps: list, refs: Optional[list] = None, **options) -> float:
    """Mean over sentences of the registered task loss ``name``."""
    costs = task_losses.build_task_loss(name, **options)(hyps, refs)
    return costs.double().mean().item()


def nonterm_costs(raw_hyps: list[str], max_len: int):
    """Per hypothesis (raw H- text, in the tokens the decoder counted), 1 where it
    reached ``max_len`` tokens without ending, else 0 (the ``nonterm`` task loss)."""
    # Restore the EOS fairseq stripped from every hypothesis that ended before the limit.
    with_eos = [t if len(t) >= max_len else t + [_EOS] for t in map(str.split, raw_hyps)]
    return task_losses.build_task_loss("nonterm", eos=_EOS)(with_eos, None)


def bleu_by_source_length(hyps: list[str], refs: list[str], srcs: list[str], edges: list[int]) -> dict:
    """Corpus BLEU per source-length bucket [0, e1), [e1, e2), ..., >= e_last
    (whitespace tokens of the source); None for an empty bucket."""
    names = [f"{lo}-{hi}" for lo, hi in zip([0] + edges[:-1], edges)] + [f"{edges[-1]}+"]
    groups: list[list[int]] = [[] for _ in names]
    for i, src in enumerate(srcs):
        n = len(src.split())
        groups[sum(n >= e for e in edges)].append(i)
    return {name: (sacrebleu.corpus_bleu([hyps[i] for i in g], [[refs[i] for i in g]]).score if g else None)
            for name, g in zip(names, groups)}


def score(
    hyps: list[str], refs: list[str], raw_hyps: list[str], max_len: Optional[int]
) -> dict[str, Optional[float]]:
    """Corpus and mean per-sentence metrics of B hypotheses against B references."""
    hyp_tokens = [h.split() for h in hyps]
    ref_tokens = [r.split() for r in refs]
    sbleu_cost = mean_cost("sbleu", hyps, refs)
    nonterm = None if max_len is None else nonterm_costs(raw_hyps, max_len).double().mean().item()
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    return {
        "bleu": bleu.score,
        "precisions": [float(p) for p in bleu.precisions],
        "length_ratio": bleu.sys_len / max(bleu.ref_len, 1),
        "sentence_bleu": 100.0 * (1.0 - sbleu_cost),
        "edit": mean_cost("edit", hyp_tokens, ref_tokens),
        "rep4": mean_cost("rep", hyp_tokens, n=4),
        "nonterm": nonterm,
        "avg_hyp_len": sum(map(len, hyp_tokens)) / len(hyp_tokens),
        "n_sentences": len(hyps),
    }


def format_table(results: dict[str, Optional[float]]) -> str:
    """Two aligned columns: metric name and value."""
    labels = {
        "bleu": "corpus BLEU",
        "sentence_bleu": "mean sentence BLEU",
        "edit": "mean edit cost",
        "rep4": "rep-4",
        "nonterm": "non-termination",
        "avg_hyp_len": "avg hypothesis length",
        "length_ratio": "length ratio (BLEU)",
        "n_sentences": "sentences",
    }
    width = max(map(len, labels.values()))
    rows = []
    for key, label in labels.items():
        value = results[key]
        if value is None:
            text = "n/a"
        elif key == "n_sentences":
            text = str(value)
        elif key in ("bleu", "sentence_bleu", "avg_hyp_len"):
            text = f"{value:.2f}"
        elif key == "length_ratio":
            text = f"{value:.3f}"
        else:
            text = f"{value:.4f}"
        rows.append(f"{label:<{width}}  {text:>8}")
    if results.get("precisions") is not None:
        rows.append(f"{'n-gram precisions':<{width}}  " + "/".join(f"{p:.1f}" for p in results["precisions"]))
    for bucket, value in (results.get("bleu_by_source_length") or {}).items():
        text = "n/a" if value is None else f"{value:.2f}"
        rows.append(f"{'BLEU, source ' + bucket:<{width}}  {text:>8}")
    for key in sorted(k for k in results if k.startswith("cost_")):  # with --task-loss
        rows.append(f"{'cost ' + key[len('cost_'):]:<{width}}  {results[key]:>8.4f}")
    if "task_loss" in results:
        rows.append(f"{'task loss (weighted)':<{width}}  {results['task_loss']:>8.4f}")
    return "\n".join(rows)
