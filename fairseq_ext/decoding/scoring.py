"""Decode-and-score for sequence-level criterions (MGS, MRT, PG) and validation.

``BatchScorer`` turns a fairseq batch into per-sequence task losses of decoded
candidates: it decodes with ``decoding.candidates`` (translation: from the
source; ``text_completion``: continuing the prefix) and scores with a weighted sum
of registered task losses (``--*-task-loss "edit"`` or ``"edit=1,rep=0.5"``)
against the references (and the sources / prefixes for the ``lm`` cost).
"""
import copy
from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.task_losses import TASK_LOSSES, task_loss_names
from fairseq_ext.runtime.distributed import unwrap
from fairseq_ext.decoding.candidates import Candidates, DecodeConfig, decode_candidates, sequence_log_probs
from fairseq_ext.decoding.sequence_cost import LMScorerCost, SequenceCost, resolve_post_process
from fairseq_ext.tasks.text_completion import TextCompletionTask, prefix_sample


def parse_cost_spec(spec: str, option: str = "--mgs-task-loss") -> Dict[str, float]:
    """``"sbleu"`` -> {"sbleu": 1.0}; ``"edit=1,rep=0.5"`` -> {"edit": 1.0, "rep": 0.5}."""
    out: Dict[str, float] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            raise ConfigError(f"{option}: empty item in {spec!r}")
        name, sep, weight = item.partition("=")
        name = name.strip()
        if name not in task_loss_names():
            raise ConfigError(f"{option}: unknown task loss {name!r}; valid: {', '.join(task_loss_names())}")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ConfigError(f"{option}: weight of {name!r} is not a number: {weight!r}") from None
        if name in out:
            raise ConfigError(f"{option}: {name!r} given twice")
        out[name] = w
    return out


def check_candidate_model(task, model, criterion: str) -> None:
    """Candidates are decoded from a source (encoder-decoder model) or continue a
    prompt (``--task text_completion``); refuse a decoder-only model elsewhere."""
    if getattr(model, "encoder", None) is None and not isinstance(task, TextCompletionTask):
        raise ConfigError(f"--criterion {criterion}: {type(model).__name__} has no encoder; a decoder-only model "
                         f"continues prompts, which --task text_completion provides (got {type(task).__name__})")


class BatchScorer:
    """Per-sequence weighted task loss of decoded candidates for fairseq batches.

    task: the fairseq task (its target dictionary gives the ids' meaning).
    spec: weighted costs (see ``parse_cost_spec``).
    post_process: BPE removal for text costs: ``auto`` (read off the target
        dictionary), ``none`` or a fairseq ``--post-process`` value; see
        ``sequence_cost.resolve_post_process``.
    score_model: checkpoint path for the ``lm`` cost; None: a frozen copy of the
        model the first time it is used (MGS paper: the LM task loss under the
        model as it was when fine-tuning started).
    criterion: the criterion's name, for option names in messages
        (``--{criterion}-task-loss``, ``--{criterion}-post-process``).
    """

    def __init__(self, task, spec: str, post_process: Optional[str] = "auto", score_model: Optional[str] = None,
                 criterion: str = "mgs"):
        self.weights = parse_cost_spec(spec, f"--{criterion}-task-loss")
        self.dictionary = task.target_dictionary
        text_costs = [name for name in self.weights if TASK_LOSSES[name].input_kind == "text"]
        self.post_process = resolve_post_process(post_process, self.dictionary, f"--{criterion}-post-process",
                                                 text_costs)
        self.score_model_path = score_model
        self.costs: Dict[str, SequenceCost] = {}
        self._cache = None
        for name in self.weights:
            if name == "lm":
                continue  # built lazily: needs the scorer
            self.costs[name] = SequenceCost(name, self.dictionary, post_process=self.post_process)
        if "lm" in self.weights and score_model is not None:
            self.costs["lm"] = SequenceCost("lm", self.dictionary, scorer=LMScorerCost.from_checkpoint(score_model).scorer)

    def ensure_lm_scorer(self, model) -> None:
        """Freeze a copy of ``model`` as the ``lm`` scorer, once (when no checkpoint was given)."""
        if "lm" in self.weights and "lm" not in self.costs:
            scorer = copy.deepcopy(unwrap(model))
            self.costs["lm"] = SequenceCost("lm", self.dictionary, scorer=scorer)
            self._cache = None

    @staticmethod
    def decode_inputs(sample: Dict, dictionary) -> Tuple[Dict, Optional[Tensor]]:
        """(batch as the decoder sees it, prefix tokens or None)."""
        if "prefix" in sample:
            return prefix_sample(sample, dictionary.pad(), dictionary.eos()), sample["prefix"]
        return sample, None

    def references(self, sample: Dict) -> List[Tensor]:
        return [utils.strip_pad(t, self.dictionary.pad()) for t in sample["target"]]

    def sources(self, sample: Dict) -> List[Tensor]:
        if "prefix" in sample:
            return list(sample["prefix"])
        pad = self.dictionary.pad()
        return [utils.strip_pad(t, pad) for t in sample["net_input"]["src_tokens"]]

    def decode(self, model, sample: Dict, cfg: DecodeConfig, generator=None) -> Tuple[Candidates, Dict]:
        batch, prefix = self.decode_inputs(sample, self.dictionary)
        return decode_candidates(unwrap(model), batch, cfg, prefix_tokens=prefix, generator=generator), batch

    def _prepared(self, batch: Dict) -> Tuple[Dict[str, list], List[Tensor]]:
        """References converted for every cost, and the sources, for this batch; cached
        while the batch's targets stay the same (MGS scores one batch K + 1 times)."""
        target = batch["target"]
        cache = self._cache
        if cache is not None and cache[0].shape == target.shape and torch.equal(cache[0], target):
            return cache[1], cache[2]
        refs = self.references(batch)
        converted = {name: cost.convert_refs(refs) for name, cost in self.costs.items()}
        sources = self.sources(batch)
        self._cache = (target.clone(), converted, sources)
        return converted, sources

    def score(self, hyps: List[Tensor], source_index: Tensor, batch: Dict) -> Tuple[Tensor, Dict[str, Tensor]]:
        """(weighted cost per hypothesis (N,), {name: per-hypothesis cost}); hypothesis j
        answers input ``source_index[j]`` of ``batch``."""
        if batch.get("target") is None:
            raise ValueError("sequence-level task losses need references: the batch has no target")
        idx = source_index.tolist()
        refs_all, srcs_all = self._prepared(batch)
        srcs = [srcs_all[i] for i in idx]
        per_name = {}
        # most costs are computed on the CPU (strings, edit distances), an LM's on its device; all
        # are returned on the device of the hypotheses' indices, i.e. the model's, where the criteria
        # combine them with log-probabilities and all-reduce them (NCCL reduces CUDA tensors only)
        total = torch.zeros(len(hyps), device=source_index.device)
        for name, w in self.weights.items():
            cost = self.costs[name]
            refs = [refs_all[name][i] for i in idx]
            c = cost.from_converted(cost.convert_hyps(hyps), refs, sources=srcs).to(total.device)
            per_name[name] = c
            total += w * c
        return total, per_name


def reference_nll(model, batch: Dict, prefix_tokens: Optional[Tensor] = None) -> Tensor:
    """(B,) sequence NLL -log p(y* | x) of the references, differentiable (for the
    MLE terms of MRT and PG); ``batch`` as returned by ``BatchScorer.decode``."""
    pad = model.decoder.dictionary.pad()
    refs = [utils.strip_pad(t, pad) for t in batch["target"]]
    index = torch.arange(len(refs), device=batch["target"].device)
    return -sequence_log_probs(model, batch, refs, index, prefix_tokens=prefix_tokens)


def log_sentence_means(logging_outputs, keys) -> None:
    """fairseq metrics: each key's sum over the logging outputs / number of sentences."""
    from fairseq import metrics

    n = sum(log.get("nsentences", 0) for log in logging_outputs)
    if n == 0:
        return
    for key in keys:
        metrics.log_scalar(key, sum(log.get(key, 0) for log in logging_outputs) / n, n, round=4)
