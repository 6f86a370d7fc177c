"""Tagging scores of decoded label sequences: span-level NER precision / recall / F1
(conlleval semantics) or token accuracy (POS), overall and per label
(``scripts/score_tagging.py`` prints them). The metrics are
``fairseq_ext.core.tagging_metrics``'s."""
from __future__ import annotations

from typing import Dict, List

from fairseq_ext.core import tagging_metrics
from fairseq_ext.runtime.cli import ConfigError


def score(hyps: List[List[str]], refs: List[List[str]], scheme: str = "auto") -> Dict:
    """Metrics of B hypothesis label sequences against B references (see EPILOG)."""
    for i, (h, r) in enumerate(zip(hyps, refs)):
        if len(h) != len(r):
            raise ConfigError(f"sentence {i}: {len(h)} predicted labels for {len(r)} reference labels")
    if scheme == "auto":
        scheme = "chunk" if tagging_metrics.is_chunk_tagset({lab for r in refs for lab in r}) else "token"
    if scheme == "chunk":
        results = tagging_metrics.chunk_scores(refs, hyps)
    else:
        results = tagging_metrics.token_scores(refs, hyps)
    return {"scheme": scheme, "sentences": len(refs), **results}


def format_table(results: Dict) -> str:
    """Overall metrics, then one row per entity type (chunk) or label (token)."""
    lines = [f"{'sentences':<14}{results['sentences']:>10}", f"{'tokens':<14}{results['tokens']:>10}",
             f"{'accuracy':<14}{results['accuracy']:>10.2f}"]
    if results["scheme"] == "chunk":
        lines += [f"{name:<14}{results[name]:>10.2f}" for name in ("precision", "recall", "f1", "f1_macro")]
        rows, head = results["per_type"], "type"
    else:
        rows, head = results["per_label"], "label"
    width = max([len(head)] + [len(k) for k in rows])
    lines.append("")
    lines.append(f"{head:<{width}}  {'precision':>9}  {'recall':>7}  {'f1':>7}  {'gold':>7}  {'predicted':>9}  "
                 f"{'correct':>7}")
    for key, row in rows.items():
        lines.append(f"{key:<{width}}  {row['precision']:>9.2f}  {row['recall']:>7.2f}  {row['f1']:>7.2f}  "
                     f"{row['gold']:>7}  {row['predicted']:>9}  {row['correct']:>7}")
    return "\n".join(lines)
