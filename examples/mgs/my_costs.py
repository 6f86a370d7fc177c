"""Your own metric as the task loss of MGS, MRT and PG: two costs to copy.

Name a class by import path, with this folder on PYTHONPATH:

    PYTHONPATH=examples/mgs fairseq-train ... --criterion mrt --mrt-task-loss my_costs:LengthGap=1,sbleu=0.5

``LengthGap`` runs anywhere (it is what docs/task_losses.md shows); ``Comet`` wraps a
COMET model from the ``unbabel-comet`` package (``pip install unbabel-comet``; the
model is downloaded on first use, so it is not run by the tests).
"""
from typing import List, Optional

import torch

from fairseq_ext.core.task_losses import TaskLoss


class LengthGap(TaskLoss):
    """|words(hypothesis) - words(source)| / 10: a cost that reads the source."""

    needs_reference = False  # references are not passed
    needs_source = True  # the source of each hypothesis comes beside it
    input_kind = "text"  # hypotheses and sources as detokenized text

    def sentence_cost(self, hyp: str, ref: Optional[str], source: str) -> float:
        return abs(len(hyp.split()) - len(source.split())) / 10


class Comet(TaskLoss):
    """1 - COMET (Rei et al., 2020; a source-aware neural metric), batched on the training device.

    COMET scores a translation from its source, the hypothesis and the reference; higher is
    better, so the cost is 1 - score. ``batch_size`` bounds the hypotheses per forward pass;
    every call runs without gradients. Fine-tuning against a learned metric invites reward
    hacking (outputs the metric likes that a reader does not): mix it with sBLEU
    (``my_costs:Comet=1,sbleu=0.5``), keep the criteria's MLE term, and watch the lengths.
    """

    needs_reference = True
    needs_source = True
    input_kind = "text"
    batch_size = 64
    model_name = "Unbabel/wmt22-comet-da"

    def __init__(self) -> None:
        from comet import download_model, load_from_checkpoint

        self.model = load_from_checkpoint(download_model(self.model_name))
        self.gpus = 0

    def setup(self, device: torch.device) -> None:
        self.gpus = 1 if torch.device(device).type == "cuda" else 0
        self.model.eval()

    def batch_cost(self, hyps: List[str], refs: List[str], sources: Optional[List[str]] = None,
                   prepared=None) -> List[float]:
        data = [{"src": x, "mt": h, "ref": r} for h, r, x in zip(hyps, refs, sources)]
        out = self.model.predict(data, batch_size=len(data), gpus=self.gpus, progress_bar=False)
        return [1.0 - s for s in out.scores]
