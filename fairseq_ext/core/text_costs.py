"""The task losses on detokenized text: ``sbleu`` and ``chrf`` (sacrebleu, with their
aggregated forms for MBR from ``core.ngram_stats``) and ``comet`` (unbabel-comet, imported
when built). Registered by name (``core.task_losses.register_task_loss``) when the package
``fairseq_ext.core`` is imported."""
from __future__ import annotations

import inspect
from typing import Optional

import torch

from fairseq_ext.core.task_losses import TaskLoss, register_task_loss


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


class _ScoreFromStats(TaskLoss):
    """1 - score / 100 of a sacrebleu metric computed from n-gram statistics (``self.stats``,
    ``core.ngram_stats``), clamped to [0, 1]; its aggregated form scores each hypothesis
    against the references' expected statistics."""

    needs_reference = True
    input_kind = "text"
    aggregatable = True
    stats = None  # set by the subclass

    def sentence_cost(self, hyp: str, ref: str) -> float:
        return _clamp01(1.0 - self.stats.score(hyp, ref) / 100.0)

    def aggregated_cost(self, hyps, refs, weights=None, source=None) -> torch.Tensor:
        aggregate = self.stats.aggregate(refs, weights)
        return torch.tensor([_clamp01(1.0 - self.stats.score_aggregate(h, aggregate) / 100.0) for h in hyps])


@register_task_loss("sbleu")
class SentenceBleuCost(_ScoreFromStats):
    """1 - sBLEU / 100, sacrebleu's smoothed sentence BLEU with effective order."""

    def __init__(self, smooth_method: str = "exp", smooth_value: Optional[float] = None) -> None:
        from sacrebleu.metrics import BLEU

        from fairseq_ext.core.ngram_stats import BleuStats

        self.bleu = BLEU(
            smooth_method=smooth_method, smooth_value=smooth_value, effective_order=True
        )
        self.stats = BleuStats(self.bleu)  # sacrebleu's sentence_score, each sentence counted once


@register_task_loss("chrf")
class ChrfCost(_ScoreFromStats):
    """1 - chrF / 100, sacrebleu's sentence chrF (character 6-grams; ``beta`` weights recall
    beta times as much as precision: 2, sacrebleu's default, rewards long hypotheses; 1
    weights both alike; ``word_order`` 2 is chrF++)."""

    def __init__(self, beta: float = 2, word_order: int = 0) -> None:
        from sacrebleu.metrics import CHRF

        from fairseq_ext.core.ngram_stats import ChrfStats

        if not beta > 0:
            raise ValueError(f"chrf: beta must be > 0, got {beta}")
        self.chrf = CHRF(beta=beta, word_order=word_order)
        self.stats = ChrfStats(self.chrf)  # sacrebleu's sentence_score, each sentence counted once


@register_task_loss("comet")
class CometCost(TaskLoss):
    """1 - COMET (Rei et al., 2020), a learned metric that reads the source, the hypothesis
    and the reference (a quality-estimation model such as CometKiwi: the source and the hypothesis
    only, and the cost is reference-free), from the ``unbabel-comet`` package (``pip install unbabel-comet``);
    batched on the training device, without gradients.

    model: a model of COMET's hub (downloaded by ``comet.download_model`` on first use and
        cached there) or the path of a local checkpoint (``.ckpt``), which loads offline.
    batch_size: hypotheses per forward pass.

    COMET's scores are near [0, 1] (higher is better), so the cost is 1 - score. Trained
    against, a learned metric invites reward hacking (outputs it likes that a reader does
    not): mix it with sBLEU (``comet=1,sbleu=0.5``), keep the criteria's MLE term and
    watch ``len_ratio`` / ``rep4``."""

    needs_reference = True
    needs_source = True
    input_kind = "text"
    batch_size = 64

    @classmethod
    def unavailable(cls) -> Optional[str]:
        import importlib.util

        if importlib.util.find_spec("comet") is None:
            return "the unbabel-comet package is not installed (pip install unbabel-comet)"
        return None

    def __init__(self, model: str = "Unbabel/wmt22-comet-da", batch_size: int = 64) -> None:
        import os

        import comet

        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ValueError(f"comet: batch_size must be a positive int, got {batch_size!r}")
        self.model_name = str(model)
        path = self.model_name if os.path.isfile(self.model_name) else comet.download_model(self.model_name)
        self.model = comet.load_from_checkpoint(path)
        # a quality-estimation model (CometKiwi, wmt20-comet-qe-da) reads the source and the hypothesis only:
        # the cost is then reference-free (MBR reranks by it, N evaluations a sentence)
        referenceless = getattr(self.model, "is_referenceless", None)
        self.needs_reference = not (callable(referenceless) and bool(referenceless()))
        self.batch_size = batch_size
        self.devices: Optional[list] = None  # None: COMET's predict on the CPU
        # reference aggregation needs a regression model's estimator over the sentence embeddings of
        # the source, the hypothesis and the reference (wmt22-comet-da and the other RegressionMetric models)
        estimate = getattr(self.model, "estimate", None)
        self.aggregatable = (self.needs_reference and callable(estimate)
                             and hasattr(self.model, "get_sentence_embedding")
                             and hasattr(getattr(self.model, "encoder", None), "prepare_sample")
                             and "ref_sentemb" in inspect.signature(estimate).parameters)

    def setup(self, device: torch.device) -> None:
        device = torch.device(device)
        self.devices = [device.index or 0] if device.type == "cuda" else None
        self.model.eval()

    def batch_cost(self, hyps: list, refs: list, sources: Optional[list] = None, prepared=None) -> torch.Tensor:
        if self.needs_reference:
            data = [{"src": x, "mt": h, "ref": r} for h, r, x in zip(hyps, refs, sources)]
        else:  # no reference reaches a quality-estimation model
            data = [{"src": x, "mt": h} for h, x in zip(hyps, sources)]
        gpus = {"gpus": 1, "devices": self.devices} if self.devices is not None else {"gpus": 0}
        out = self.model.predict(data, batch_size=len(data), progress_bar=False, **gpus)
        return 1.0 - torch.tensor([float(x) for x in out.scores], dtype=torch.float32)

    def _embed(self, sentences: list, device: torch.device) -> torch.Tensor:
        """COMET's sentence embeddings (len(sentences), D), ``batch_size`` sentences a pass."""
        out = []
        for i in range(0, len(sentences), self.batch_size):
            batch = self.model.encoder.prepare_sample(list(sentences[i : i + self.batch_size]))
            out.append(self.model.get_sentence_embedding(**{k: v.to(device) for k, v in batch.items()}))
        return torch.cat(out)

    def aggregated_cost(self, hyps, refs, weights=None, source=None) -> torch.Tensor:
        """1 - COMET's estimate of every hypothesis against the weighted mean of the references'
        sentence embeddings (Vamvas & Sennrich, 2024): H + R + 1 encodings and H estimator
        passes instead of H x R forward passes. One reference: the plain score."""
        device = torch.device("cuda", self.devices[0]) if self.devices else torch.device("cpu")
        self.model.to(device)
        with torch.no_grad():
            embedded = self._embed([source] + list(refs) + list(hyps), device)
            src, ref, hyp = embedded[:1], embedded[1 : 1 + len(refs)], embedded[1 + len(refs) :]
            w = (torch.full((len(refs),), 1.0 / len(refs)) if weights is None
                 else torch.as_tensor(weights, dtype=torch.float64))
            mean = (w / w.sum()).to(ref) @ ref
            score = self.model.estimate(src.expand(len(hyps), -1), hyp, mean.expand(len(hyps), -1))["score"]
        return 1.0 - score.detach().float().cpu().view(-1)
