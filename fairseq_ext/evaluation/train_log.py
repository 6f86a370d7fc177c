"""fairseq-train JSON logs (``--log-format json``): reading their stats lines and drawing
logged metrics (``scripts/plot/plot_log.py``; tables of several experiments read them too).

A log is what ``fairseq-train --log-format json`` prints (``2>&1 | tee FILE``): lines
``... | TAG | {json}`` with TAG ``train_inner``, ``train`` or the validation subset; or
the file ``--log-file FILE`` writes, the JSON alone (the tag is then read from the keys).
"""
import json
import re
from typing import Dict, List, Sequence, Tuple

from fairseq_ext.evaluation.plotting import pyplot
from fairseq_ext.runtime.cli import ConfigError

STATS_LINE = re.compile(r"\| ([\w-]+) \| (\{.*\})\s*$")

Series = Dict[str, Dict[str, Tuple[List[float], List[float]]]]  # panel -> line label -> (xs, ys)

# --mgs: the MGS criterion's per-update diagnostics (docs/mgs.md, "Logged every update")
MGS_PANELS = ["mgs_weight_entropy+mgs_weight_std", "mgs_mle_weight+mgs_top_is_mle", "loss+mgs_cand_best+mgs_cand_mean"]
# y-axis labels of several-metric panels (otherwise the panel's name)
PANEL_LABELS = dict(zip(MGS_PANELS, ["candidate weights", "MLE component", "task loss C"]))


def _tag(stats: dict) -> str:
    """The tag of a bare JSON line (``--log-file``): ``valid`` / ``train`` for
    end-of-epoch lines (their keys carry it: ``valid_num_updates``), else train_inner."""
    for key in stats:
        if key.endswith("_num_updates"):
            return key[: -len("_num_updates")]
    return "train_inner"


def read_log(path: str) -> List[Tuple[str, Dict[str, float]]]:
    """(tag, numeric stats) of each JSON stats line of a fairseq log, in order."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read log {path}: {e.strerror}") from None
    records, previous = [], None
    for line in text.splitlines():
        m = STATS_LINE.search(line)
        tag, body = (m.group(1), m.group(2)) if m else (None, line.strip())
        if not body.startswith("{") or line == previous:
            continue
        previous = line
        try:
            stats = json.loads(body)
        except json.JSONDecodeError:
            continue
        numeric = {}
        for key, value in stats.items():
            try:
                numeric[key] = float(value)
            except (TypeError, ValueError):
                pass
        records.append((tag or _tag(stats), numeric))
    if not records:
        raise ConfigError(f"{path} has no JSON stats lines (train with --log-format json)")
    return records


def series(runs: Dict[str, List[Tuple[str, Dict[str, float]]]], panels: Sequence[str], x: str) -> Series:
    """For each panel (a metric, or metrics joined by '+') and run, the (x, value) pairs
    of the lines that log the metric (x read as ``TAG_X`` or ``X`` in the same line;
    lines without it are left out). A one-metric panel's lines are named after the
    runs; a several-metric panel's after the metrics (``RUN: METRIC`` with several runs)."""
    out: Series = {}
    for panel in panels:
        out[panel] = {}
        metrics = panel.split("+")
        for metric in metrics:
            found = False
            for label, records in runs.items():
                xs, ys = [], []
                for tag, stats in records:
                    x_value = stats.get(f"{tag}_{x}", stats.get(x))
                    if metric in stats and x_value is not None:
                        xs.append(x_value)
                        ys.append(stats[metric])
                if xs:
                    found = True
                    line = label if len(metrics) == 1 else metric if len(runs) == 1 else f"{label}: {metric}"
                    out[panel][line] = (xs, ys)
            if not found:
                logged = sorted({k for records in runs.values() for _, stats in records for k in stats})
                raise ConfigError(f"--metric {metric} (with --x {x}) is in none of the logs; logged: {', '.join(logged)}")
    return out


def plot(data: Series, x: str):
    """A matplotlib figure: one panel per metric, one line per run."""
    plt = pyplot()
    fig, axes = plt.subplots(len(data), 1, figsize=(6, 2.6 * len(data)), squeeze=False)
    for ax, (metric, by_run) in zip(axes[:, 0], data.items()):
        for label, (xs, ys) in by_run.items():
            ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
        ax.set_ylabel(PANEL_LABELS.get(metric, metric))
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel(x)
    fig.tight_layout()
    return fig
