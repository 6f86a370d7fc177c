"""fairseq adapter for the task losses of ``fairseq_ext.core.task_losses``.

``SequenceCost`` turns decoded token tensors (fairseq dictionary ids) into what a
core loss takes: detokenized text for ``sbleu`` / ``chrf`` (BPE removed with fairseq's
``--bpe`` or ``post_process``, then the data's tokenizer's ``decode``: ``text_tools``), dictionary
symbols for the token-level losses (padding and EOS removed, except for
``nonterm`` which looks for the EOS).

``resolve_post_process`` turns a criterion's ``--*-post-process`` value into the
BPE removal those text costs use: ``auto`` (the default) reads the scheme off the
target dictionary; an explicit value that disagrees with the dictionary is kept
but logged as a warning.

This module also defines the ``lm`` cost: the negative log-probability of the
hypothesis under a frozen fairseq scorer, conditional on the source for
encoder-decoder scorers and on the prefix for language models (MGS paper,
section 5.1: "LM" task loss).
"""
import json
import logging
from argparse import Namespace
from typing import List, Optional, Sequence, Tuple, Union

import torch
from fairseq.data import data_utils
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.subwords import SUBWORD_MARKS, detect_subword_scheme
from fairseq_ext.core.task_losses import CostTerm, TaskLoss, parse_task_loss_spec, register_task_loss
from fairseq_ext.scoring.teacher_forced import sequence_log_probs, source_batch

logger = logging.getLogger(__name__)

POST_PROCESS_HELP = (
    "BPE removal before text costs (sbleu, chrf): 'auto' reads it off the target dictionary (sentencepiece, "
    "subword_nmt or none), 'none' scores the dictionary's symbols as they are, or a fairseq --post-process "
    "value (sentencepiece, subword_nmt, '@@ ', ...)"
)
# fairseq's --post-process values for the two schemes detect_subword_scheme recognises
_SCHEME_OF = {"sentencepiece": "sentencepiece", "subword_nmt": "subword_nmt", "@@ ": "subword_nmt", "@@": "subword_nmt"}


def resolve_post_process(value: Optional[str], dictionary, option: str, costs: Sequence[str]) -> Optional[str]:
    """The BPE removal (a fairseq ``post_process`` value, or None) for the text costs ``costs``.

    value: the option's value: ``auto``, ``none`` / None, or a fairseq
        ``--post-process`` value. ``auto`` becomes what ``dictionary``'s symbols
        look like (``detect_subword_scheme``); the choice is logged. An explicit
        value is kept, with a warning when the dictionary looks like another
        scheme (text costs on subword pieces, or words glued together).
    option: the option's name, for messages. An unknown value raises ValueError.
    costs: the names of the text costs; none: None, nothing logged (symbol costs
        never remove BPE).
    """
    value = None if value in (None, "none") else value
    if value not in (None, "auto"):
        try:
            data_utils.post_process("a b", value)
        except NotImplementedError:
            raise ConfigError(f"{option}: unknown value {value!r}; use auto, none, sentencepiece, subword_nmt "
                             "or another value of fairseq's --post-process") from None
    if not costs:
        return None
    detected, share = detect_subword_scheme(dictionary.symbols[dictionary.nspecial:])
    evidence = (f"{share:.0%} of the target dictionary's symbols {SUBWORD_MARKS[detected]}" if detected
                else "the target dictionary's symbols carry no sentencepiece or subword-nmt marks")
    what = "/".join(costs)
    if value == "auto":
        logger.info(f"{option} auto: {detected or 'none'} ({evidence}); {what} scored on "
                    + (f"text with the {detected} segmentation removed" if detected else "the symbols as they are"))
        return detected
    given = _SCHEME_OF.get(value) if value is not None else None
    if detected != given and (detected is not None or given is not None):
        effect = "scored on subword pieces, not words" if value is None or detected else "scored on garbled words"
        logger.warning(f"{option} {value or 'none'}, but {evidence}: {what} will be {effect}. "
                       f"Use {option} auto (the default) to follow the dictionary.")
    return value


def text_tools(cfg, task) -> Tuple[object, object, object, str]:
    """(bpe, target tokenizer, source tokenizer, how) with which text costs see the data's
    text as its metric does, from a fairseq-train configuration ``cfg`` and its task:

    * fairseq's ``--bpe`` and ``--tokenizer`` where given (the data's own tools, as
      fairseq-generate decodes with them: ``bpe.decode``, then ``tokenizer.decode``);
    * else the task's ``--eval-bleu-detok`` (translation: what its validation BLEU
      detokenizes with), with ``--eval-bleu-detok-args``;
    * else none (``None``s): only the BPE removal of ``--*-post-process``.

    A Moses tokenizer detokenizes the sources with the source language's rules. ``how``
    says what was chosen, for the log."""
    from fairseq.data import encoders

    def lang(value, side):
        return value if value else (getattr(getattr(task, "cfg", None), f"{side}_lang", None) or "en")

    def moses(source_lang, target_lang, **options):  # (the target's detokenizer, the sources')
        src, tgt = lang(source_lang, "source"), lang(target_lang, "target")
        return tuple(encoders.build_tokenizer(Namespace(tokenizer="moses", source_lang=src, target_lang=side,
                                                        **options)) for side in (tgt, src))

    bpe = encoders.build_bpe(cfg.bpe) if cfg.get("bpe") is not None else None
    target = source = None
    how = []
    if cfg.get("tokenizer") is not None:
        tok_cfg = cfg.tokenizer
        name = tok_cfg.get("_name")
        if name == "moses":
            target, source = moses(tok_cfg.get("source_lang"), tok_cfg.get("target_lang"),
                                   **{k: tok_cfg.get(k) for k in ("moses_no_dash_splits", "moses_no_escape")})
        else:
            target = source = encoders.build_tokenizer(tok_cfg)
        how.append(f"detokenized with --tokenizer {name}")
    else:
        task_cfg = getattr(task, "cfg", None)
        detok = getattr(task_cfg, "eval_bleu_detok", None) if task_cfg is not None else None
        if detok not in (None, "", "space"):
            args = json.loads(getattr(task_cfg, "eval_bleu_detok_args", None) or "{}")
            if detok == "moses":
                target, source = moses(args.pop("source_lang", None), args.pop("target_lang", None), **args)
            else:
                target = source = encoders.build_tokenizer(Namespace(tokenizer=detok, **args))
            how.append(f"detokenized with --eval-bleu-detok {detok}")
    if bpe is not None:
        how.insert(0, f"subwords removed by --bpe {cfg.bpe.get('_name')}")
    return bpe, target, source, ", ".join(how)


@register_task_loss("lm")
class LMScorerCost(TaskLoss):
    """-sum_t log p_scorer(y_t | y_<t, x) of each hypothesis (``normalize``: per token).

    Hypotheses are token ids (1-D LongTensors ending in EOS where one was produced);
    the sources are the source sentences (encoder-decoder scorer) or the prefixes
    (decoder-only scorer). The scorer is put in eval mode and never receives gradients;
    it stays on the device it was loaded to (``setup`` moves it to the training device).
    """

    needs_reference = False
    needs_source = True
    needs_model = True
    input_kind = "ids"

    def __init__(self, model: torch.nn.Module, normalize: bool = False, left_pad_source: bool = True):
        model.eval()  # (not model.eval()'s value: after fairseq's make_generation_fast_, train() returns None)
        self.scorer = model
        for p in self.scorer.parameters():
            p.requires_grad_(False)
        self.normalize = normalize
        self.left_pad_source = left_pad_source

    def setup(self, device: torch.device) -> None:
        self.scorer.to(device)

    def batch_cost(self, hyps: List[Tensor], refs=None, sources: Optional[List[Tensor]] = None,
                   prepared=None) -> Tensor:
        decoder = self.scorer.decoder
        pad, eos = decoder.dictionary.pad(), decoder.dictionary.eos()
        device = next(self.scorer.parameters()).device
        hyps = [h.to(device) for h in hyps]
        sources = [x.to(device) for x in sources]
        index = torch.arange(len(hyps), device=device)
        if getattr(self.scorer, "encoder", None) is not None:
            sample, index = source_batch(sources, pad, eos, left_pad=self.left_pad_source)
            lp = sequence_log_probs(self.scorer, sample, hyps, index)
        else:
            prefixes = data_utils.collate_tokens(sources, pad, eos, left_pad=False)
            sample = {"net_input": {"src_tokens": prefixes}}
            lp = sequence_log_probs(self.scorer, sample, hyps, index, prefix_tokens=prefixes)
        costs = -lp
        if self.normalize:
            costs = costs / torch.tensor([max(len(h), 1) for h in hyps], device=device)
        return costs.float()


def frozen_model(path: str) -> torch.nn.Module:
    """The model of a fairseq checkpoint, for a cost that reads one (``TaskLoss.needs_model``)."""
    from fairseq import checkpoint_utils

    models, _ = checkpoint_utils.load_model_ensemble([path])
    return models[0]


class SequenceCost:
    """Costs of fairseq token tensors under a task loss.

    term: a term of a parsed spec (``core.task_losses.CostTerm``), or the name of one cost,
        with its options (``sbleu``, ``chrf(beta=1)``, ``edit``, ``rep``, ``nonterm``,
        ``hamming``, ``lm``, or the import path of the user's own, ``module:Class``).
    dictionary: the target dictionary the token ids refer to.
    post_process: BPE removal for text losses (fairseq's ``--post-process``
        values: ``sentencepiece``, ``subword_nmt``, ``@@ ``, ...).
    tokenizer: optional fairseq tokenizer (e.g. moses) whose ``decode`` detokenizes.
    source_dictionary, source_post_process: the same for the sources, for a loss
        that reads them (default: the target's).
    options: passed to the loss (e.g. ``n=4`` for ``rep``, ``weights`` for
        ``hamming``, ``model`` for ``lm``).
    """

    def __init__(self, term: Union[CostTerm, str], dictionary, post_process: Optional[str] = None, tokenizer=None,
                 source_dictionary=None, source_post_process: Optional[str] = None, **options):
        if isinstance(term, str):
            (term,) = parse_task_loss_spec(term)
        self.name = term.base  # without its options: chrf(beta=1) is a chrf
        if self.name == "nonterm":
            options.setdefault("eos", dictionary[dictionary.eos()])
        self.loss = term.build(**options)
        self.target = _Side(dictionary, post_process, tokenizer)
        self.source = _Side(source_dictionary or dictionary,
                            source_post_process if source_dictionary is not None else post_process, tokenizer)
        self._ready = False

    @property
    def needs_reference(self) -> bool:
        return self.loss.needs_reference

    @property
    def needs_source(self) -> bool:
        return self.loss.needs_source

    def setup(self, device) -> None:
        """The loss's ``setup``, once: on its own ``device`` where it names one, else on the
        training device ``device``; "ids" inputs are moved there from then on."""
        if not self._ready:
            device = torch.device(self.loss.device) if self.loss.device is not None else torch.device(device)
            self.loss.setup(device)
            self.target.device = self.source.device = device
            self._ready = True

    def convert_hyps(self, hyps: Sequence[Tensor]) -> list:
        """Hypotheses in the form the loss takes (text, symbols or ids)."""
        return self.target.convert(hyps, self.loss.input_kind, keep_eos=self.name == "nonterm")

    def convert_refs(self, refs: Sequence[Tensor]) -> list:
        """References in the form the loss takes (EOS dropped from text and symbols)."""
        return self.target.convert(refs, self.loss.input_kind, keep_eos=False)

    def convert_sources(self, sources: Sequence[Tensor]) -> Optional[list]:
        """Sources in the form the loss takes, or None for a loss that does not read them."""
        if not self.loss.needs_source:
            return None
        return self.source.convert(sources, self.loss.source_kind or self.loss.input_kind, keep_eos=False)

    def from_converted(self, hyps: list, refs: Optional[list], sources: Optional[list] = None,
                       prepared=None) -> Tensor:
        return self.loss(hyps, refs if self.loss.needs_reference else None,
                         sources if self.loss.needs_source else None, prepared)

    def __call__(
        self,
        hyps: Sequence[Tensor],
        refs: Optional[Sequence[Tensor]] = None,
        sources: Optional[Sequence[Tensor]] = None,
    ) -> Tensor:
        """hyps, refs, sources: B 1-D LongTensors of dictionary ids. Returns (B,) costs."""
        refs = self.convert_refs(refs) if refs is not None else None
        sources = self.convert_sources(sources) if sources is not None else None
        prepared = self.loss.prepare(refs, sources)
        return self.from_converted(self.convert_hyps(hyps), refs, sources, prepared)


class _Side:
    """Token ids of one dictionary into what a loss takes: text (BPE removed, detokenized),
    symbols, or the ids themselves.

    Text is made as fairseq-generate makes its detokenized output: the symbols joined by
    spaces, then the subword segmentation removed (fairseq's ``bpe.decode`` where a ``--bpe``
    is configured, else ``post_process``), then the tokenizer's ``decode`` (e.g. Moses)."""

    def __init__(self, dictionary, post_process: Optional[str], tokenizer, bpe=None):
        self.dictionary = dictionary
        self.post_process = post_process
        self.tokenizer = tokenizer
        self.bpe = bpe
        self._symbols = list(dictionary.symbols)
        self._special = {dictionary.pad(), dictionary.eos(), dictionary.bos()}
        self.device: Optional[torch.device] = None  # where "ids" go (the cost's device, once set up)

    def convert(self, items: Sequence[Tensor], kind: str, keep_eos: bool) -> list:
        if kind == "ids":
            return [t.to(self.device) for t in items] if self.device is not None else list(items)
        if kind == "text":
            return [self.text(t) for t in items]
        d = self.dictionary
        drop = {d.pad()} if keep_eos else {d.pad(), d.eos()}
        return [[self._symbols[t] for t in tokens.tolist() if t not in drop] for tokens in items]

    def text(self, tokens: Tensor) -> str:
        """As ``Dictionary.string(tokens, post_process)`` (EOS, BOS and padding dropped),
        without its per-token overhead; then the tokenizer's ``decode``."""
        sent = " ".join(self._symbols[t] for t in tokens.tolist() if t not in self._special)
        sent = self.bpe.decode(sent) if self.bpe is not None else data_utils.post_process(sent, self.post_process)
        return self.tokenizer.decode(sent) if self.tokenizer is not None else sent
