"""Decode-and-score for sequence-level criterions (MGS, MRT, PG) and validation.

``BatchScorer`` turns a fairseq batch into per-sequence task losses of decoded
candidates: it decodes with ``decoding.candidates`` (translation: from the
source; ``text_completion``: continuing the prefix) and scores with a weighted sum
of registered task losses (``--*-task-loss "edit"`` or ``"edit=1,rep=0.5"``)
against the references (and the sources / prefixes for the ``lm`` cost).
"""
import copy
import logging
import time
from typing import Dict, List, Optional, Tuple

import torch
from fairseq import utils
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.task_losses import (TASK_LOSS_SPEC, parse_task_loss_spec, split_options, task_loss_class,
                                          task_loss_names, unique_ngram_share)
from fairseq_ext.runtime.distributed import unwrap
from fairseq_ext.decoding.candidates import (Candidates, DecodeConfig, decode_candidates, decode_grouped, decode_with_greedy,
                                             prefix_sample)
from fairseq_ext.costs.sequence_cost import LMScorerCost, SequenceCost, resolve_post_process, text_tools

logger = logging.getLogger(__name__)

# the registered names: the core's, and lm (registered by costs.sequence_cost, imported above)
TASK_LOSS_HELP = ("{what}: a registered cost (" + ", ".join(task_loss_names()) + "), your own as module:Class (a "
                  "TaskLoss subclass importable from PYTHONPATH), or a weighted sum, e.g. 'edit=1,rep=0.5' or "
                  "'my_costs:Quality=1,sbleu=0.5'")


def parse_cost_spec(spec: str, option: str = "--mgs-task-loss") -> Dict[str, float]:
    """``"sbleu"`` -> {"sbleu": 1.0}; ``"edit=1,rep=0.5"`` -> {"edit": 1.0, "rep": 0.5}; a name
    may be the import path of the user's own cost, ``"my_costs:QualityCost=1,sbleu=0.5"``.
    A bad spec: the ConfigError of the option (the message of its constraint)."""
    refusal = TASK_LOSS_SPEC.refusal(spec)
    if refusal is not None:
        raise ConfigError(f"{option} {refusal}")
    return parse_task_loss_spec(spec)


def continues_prefixes(task) -> bool:
    """Whether ``task``'s batches carry prompts (``sample["prefix"]``) that candidates
    continue (a task says so by its ``continues_prefixes``: ``text_completion``)."""
    return bool(getattr(task, "continues_prefixes", False))


def check_candidate_model(task, model, criterion: str) -> None:
    """Candidates are decoded from a source (encoder-decoder model) or continue a
    prompt (``--task text_completion``, whose ``continues_prefixes``); refuse a
    decoder-only model elsewhere."""
    if getattr(model, "encoder", None) is None and not continues_prefixes(task):
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
        classes = {name: task_loss_class(name) for name in self.weights}
        option = self.post_process_option = f"--{criterion}-post-process"
        text_costs = [name for name, cls in classes.items() if cls.input_kind == "text"]
        self.post_process = resolve_post_process(post_process, self.dictionary, option, text_costs)
        # the sources: the source sentences of a translation task, the prefixes (target side) of text completion
        source_dictionary = None
        if not continues_prefixes(task) and getattr(task, "source_dictionary", None) is not None:
            source_dictionary = task.source_dictionary
        source_text = [name for name, cls in classes.items()
                       if cls.needs_source and (cls.source_kind or cls.input_kind) == "text"]
        source_post_process = (resolve_post_process(post_process, source_dictionary, option + " (sources)",
                                                    source_text) if source_dictionary is not None else None)
        self.score_model_path = score_model
        self.costs: Dict[str, SequenceCost] = {}
        self._cache = None
        self.seconds = 0.0  # time spent computing costs, since the caller last reset it
        # the lm cost (options allowed: lm(normalize=true)) is built with its scorer
        self.lm_name = next((name for name in self.weights if split_options(name)[0] == "lm"), None)
        for name in self.weights:
            if name == self.lm_name:
                continue  # built lazily: needs the scorer
            try:
                self.costs[name] = SequenceCost(name, self.dictionary, post_process=self.post_process,
                                                source_dictionary=source_dictionary,
                                                source_post_process=source_post_process)
            except ValueError as err:  # a cost that cannot be built (a missing package, a bad option value)
                raise ConfigError(f"--{criterion}-task-loss {name}: {err}") from None
        if self.lm_name is not None and score_model is not None:
            self.costs[self.lm_name] = SequenceCost(self.lm_name, self.dictionary,
                                                    scorer=LMScorerCost.from_checkpoint(score_model).scorer)

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

    def ensure_lm_scorer(self, model) -> None:
        """Freeze a copy of ``model`` as the ``lm`` scorer, once (when no checkpoint was given)."""
        if self.lm_name is not None and self.lm_name not in self.costs:
            scorer = copy.deepcopy(unwrap(model))
            self.costs[self.lm_name] = SequenceCost(self.lm_name, self.dictionary, scorer=scorer)
            self._cache = None

    @staticmethod
    def decode_inputs(sample: Dict, dictionary) -> Tuple[Dict, Optional[Tensor]]:
        """(batch as the decoder sees it, prefix tokens or None)."""
        if "prefix" in sample:
            return prefix_sample(sample, dictionary.pad(), dictionary.eos()), sample["prefix"]
        return sample, None

    def output_shape(self, cand: Candidates, batch: Dict, prefix: str = "") -> Dict[str, float]:
        """``output_shape`` of decoded candidates against the batch's references."""
        special = (self.dictionary.eos(), self.dictionary.pad())
        return output_shape(cand.as_list(), cand.source_index, self.references(batch), special, prefix)

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

    def decode_grouped(self, model, sample: Dict, cfg: DecodeConfig, sets, generators=None) -> Tuple[List[Candidates], Dict]:
        """As ``decode``, once per parameter set of ``sets``, in one pass (``candidates.decode_grouped``)."""
        batch, prefix = self.decode_inputs(sample, self.dictionary)
        return decode_grouped(unwrap(model), batch, cfg, sets, prefix_tokens=prefix, generators=generators), batch

    def decode_with_greedy(self, model, sample: Dict, cfg: DecodeConfig) -> Tuple[Candidates, Candidates, Dict]:
        """As ``decode``, and one greedy candidate per input (``candidates.decode_with_greedy``)."""
        batch, prefix = self.decode_inputs(sample, self.dictionary)
        cand, greedy = decode_with_greedy(unwrap(model), batch, cfg, prefix_tokens=prefix)
        return cand, greedy, batch

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


def log_output_shape(logging_outputs, prefix: str = "") -> None:
    """fairseq metrics ``{prefix}len_ratio`` and ``{prefix}rep4`` from ``output_shape``'s sums
    (summed over micro-batches and workers first)."""
    from fairseq import metrics

    def total(key):
        return sum(log.get(prefix + key, 0) for log in logging_outputs)

    hyps, ref_len = total("hyps"), total("ref_len")
    if hyps > 0 and ref_len > 0:
        metrics.log_scalar(f"{prefix}len_ratio", total("hyp_len") / ref_len, ref_len, round=4)
        metrics.log_scalar(f"{prefix}rep4", total("rep4_sum") / hyps, hyps, round=4)


def log_cost_seconds(logging_outputs) -> None:
    """fairseq metric ``cost_seconds``: seconds of task-loss computation per update, summed over
    micro-batches and workers (what the metric costs; decoding not included)."""
    from fairseq import metrics

    if any("cost_seconds" in log for log in logging_outputs):
        metrics.log_scalar("cost_seconds", sum(log.get("cost_seconds", 0.0) for log in logging_outputs), round=3)


def log_sentence_means(logging_outputs, keys) -> None:
    """fairseq metrics: each key's sum over the logging outputs / number of sentences."""
    from fairseq import metrics

    n = sum(log.get("nsentences", 0) for log in logging_outputs)
    if n == 0:
        return
    for key in keys:
        metrics.log_scalar(key, sum(log.get(key, 0) for log in logging_outputs) / n, n, round=4)
