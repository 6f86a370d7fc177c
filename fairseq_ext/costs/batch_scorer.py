"""Scoring for sequence-level criterions (MGS, MRT, PG), MBR and validation.

``BatchScorer`` turns candidates decoded for a fairseq batch (``decoding.batch``) into
per-sequence task losses: a weighted sum of registered task losses (``--*-task-loss "edit"``
or ``"edit=1,rep=0.5"``) against the references (and the sources / prefixes for the ``lm``
cost). It scores what it is given; it decodes nothing.
"""
import copy
import logging
import time
from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.task_losses import TASK_LOSS_SPEC, CostTerm, parse_task_loss_spec, task_loss_names
from fairseq_ext.runtime.distributed import unwrap
from fairseq_ext.costs.sequence_cost import SequenceCost, frozen_model, resolve_post_process, text_tools

logger = logging.getLogger(__name__)

# the registered names: the core's, and lm (registered by costs.sequence_cost, imported above)
TASK_LOSS_HELP = ("{what}: a registered cost (" + ", ".join(task_loss_names()) + "), your own as module:Class (a "
                  "TaskLoss subclass importable from PYTHONPATH), or a weighted sum, e.g. 'edit=1,rep=0.5' or "
                  "'my_costs:Quality=1,sbleu=0.5'")


def parse_cost_spec(spec: str, option: str = "--mgs-task-loss") -> Tuple[CostTerm, ...]:
    """The weighted terms of ``spec`` (``core.task_losses.parse_task_loss_spec``: ``"sbleu"``,
    ``"edit=1,rep=0.5"``, ``"my_costs:QualityCost=1,sbleu=0.5"``). A bad spec: the ConfigError of
    the option (the message of its constraint)."""
    refusal = TASK_LOSS_SPEC.refusal(spec)
    if refusal is not None:
        raise ConfigError(f"{option} {refusal}")
    return parse_task_loss_spec(spec)


def continues_prefixes(task) -> bool:
    """Whether ``task``'s batches carry prompts (``sample["prefix"]``) that candidates
    continue (a task says so by its ``continues_prefixes``: ``text_completion``)."""
    return bool(getattr(task, "continues_prefixes", False))


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
        self.terms = parse_cost_spec(spec, f"--{criterion}-task-loss")
        self.weights = {term.name: term.weight for term in self.terms}
        # the key each term is logged under: its name without options, unless two terms share it
        bases = [term.base for term in self.terms]
        self.log_names = {term.name: term.base if bases.count(term.base) == 1 else term.name for term in self.terms}
        self.dictionary = task.target_dictionary
        option = self.post_process_option = f"--{criterion}-post-process"
        text_costs = [t.name for t in self.terms if t.cls.input_kind == "text"]
        self.post_process = resolve_post_process(post_process, self.dictionary, option, text_costs)
        # the sources: the source sentences of a translation task, the prefixes (target side) of text completion
        self.source_dictionary = None
        if not continues_prefixes(task) and getattr(task, "source_dictionary", None) is not None:
            self.source_dictionary = task.source_dictionary
        source_text = [t.name for t in self.terms
                       if t.cls.needs_source and (t.cls.source_kind or t.cls.input_kind) == "text"]
        self.source_post_process = (resolve_post_process(post_process, self.source_dictionary, option + " (sources)",
                                                         source_text) if self.source_dictionary is not None else None)
        self.score_model_path = score_model
        self.costs: Dict[str, SequenceCost] = {}
        self._cache = None
        self.seconds = 0.0  # time spent computing costs, since the caller last reset it
        for term in self.terms:
            if term.cls.needs_model:
                continue  # built by bind_model
            try:
                self.costs[term.name] = self._build(term)
            except ValueError as err:  # a cost that cannot be built (a missing package, a bad option value)
                raise ConfigError(f"--{criterion}-task-loss {term.name}: {err}") from None
        if score_model is not None and any(t.cls.needs_model for t in self.terms):
            self._bind(frozen_model(score_model))

    def _build(self, term: CostTerm, **options) -> SequenceCost:
        return SequenceCost(term, self.dictionary, post_process=self.post_process,
                            source_dictionary=self.source_dictionary, source_post_process=self.source_post_process,
                            **options)

    def configure_text(self, cfg, task) -> None:
        """Text costs see the data's text as its metric does: fairseq's ``--bpe`` and
        ``--tokenizer``, or the task's ``--eval-bleu-detok`` (``sequence_cost.text_tools``);
        logged once. ``cfg``: the fairseq-train configuration."""
        names = [name for name, cost in self.costs.items() if "text" in (cost.loss.input_kind, cost.loss.source_kind)]
        if not names:
            return
        bpe, target, source, how = text_tools(cfg, task)
        for name in names:
            cost = self.costs[name]
            cost.target.bpe, cost.target.tokenizer = bpe, target
            cost.source.bpe, cost.source.tokenizer = bpe, source
        self._cache = None
        removal = f"subwords removed by {self.post_process_option} {self.post_process or 'none'}" if bpe is None else ""
        raw = self.post_process == "sentencepiece" or bpe is not None  # the segmentation restores the text
        logger.info(f"text costs ({'/'.join(names)}): " + ", ".join(x for x in (removal, how) if x)
                    + ("" if how or raw else " (no --tokenizer or --eval-bleu-detok: text that was tokenized "
                                             "before segmentation stays tokenized)"))

    def take_seconds(self) -> float:
        """Seconds spent computing costs since the last call (for the criteria's ``cost_seconds``)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def bind_model(self, model) -> None:
        """Build the costs that read a fairseq model (``TaskLoss.needs_model``: ``lm``) on a frozen
        copy of ``model``, once: the ``score_model`` checkpoint's when one was given, else the
        model being trained, as it is when this is first called (MGS paper: the LM task loss
        under the model as it was when fine-tuning started)."""
        if any(t.cls.needs_model and t.name not in self.costs for t in self.terms):
            self._bind(copy.deepcopy(unwrap(model)))

    def _bind(self, model) -> None:
        for term in self.terms:
            if term.cls.needs_model and term.name not in self.costs:
                self.costs[term.name] = SequenceCost(term, self.dictionary, model=model)
        self._cache = None

    def references(self, sample: Dict) -> List[Tensor]:
        return [utils.strip_pad(t, self.dictionary.pad()) for t in sample["target"]]

    def sources(self, sample: Dict) -> List[Tensor]:
        if "prefix" in sample:
            return list(sample["prefix"])
        pad = self.dictionary.pad()
        return [utils.strip_pad(t, pad) for t in sample["net_input"]["src_tokens"]]

    def _prepared(self, batch: Dict) -> Dict[str, Tuple[Optional[list], Optional[list], Optional[list]]]:
        """Per cost: the batch's references and sources converted for it, and its ``prepare``
        of them; cached while the batch stays the same (MGS scores one batch K + 1 times)."""
        target, source = batch["target"], batch["net_input"]["src_tokens"]
        cache = self._cache
        if (cache is not None and cache[0].shape == target.shape and torch.equal(cache[0], target)
                and cache[1].shape == source.shape and torch.equal(cache[1], source)):
            return cache[2]
        refs, sources = self.references(batch), self.sources(batch)
        out = {}
        for name, cost in self.costs.items():
            cost.setup(target.device)
            r, x = cost.convert_refs(refs), cost.convert_sources(sources)
            out[name] = (r, x, cost.loss.prepare(r, x))
        self._cache = (target.clone(), source.clone(), out)
        return out

    def score(self, hyps: List[Tensor], source_index: Tensor, batch: Dict) -> Tuple[Tensor, Dict[str, Tensor]]:
        """(weighted cost per hypothesis (N,), {name: per-hypothesis cost}); hypothesis j
        answers input ``source_index[j]`` of ``batch``."""
        if batch.get("target") is None:
            raise ValueError("sequence-level task losses need references: the batch has no target")
        start = time.perf_counter()
        idx = source_index.tolist()
        prepared = self._prepared(batch)
        per_name = {}
        # most costs are computed on the CPU (strings, edit distances), an LM's on its device; all
        # are returned on the device of the hypotheses' indices, i.e. the model's, where the criteria
        # combine them with log-probabilities and all-reduce them (NCCL reduces CUDA tensors only)
        total = torch.zeros(len(hyps), device=source_index.device)
        for name, w in self.weights.items():
            cost = self.costs[name]
            refs, sources, items = ([side[i] for i in idx] if side is not None else None
                                    for side in prepared[name])
            c = cost.from_converted(cost.convert_hyps(hyps), refs, sources, items).to(total.device)
            per_name[name] = c
            total += w * c
        self.seconds += time.perf_counter() - start
        return total, per_name
