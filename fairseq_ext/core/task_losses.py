"""Task losses (costs) Δ(ŷ, y): what a cost is (``TaskLoss``), the registry of costs by name,
and the spec of a ``--*-task-loss`` option, parsed once into weighted terms (``CostTerm``).

Every loss maps a batch of B hypotheses (and, when it needs them, B references)
to a float32 CPU tensor of shape (B,) of per-sequence costs; lower is better. The
built-in costs live beside this module, registered when ``fairseq_ext.core`` is imported:

======== ========= ========= ====================================================
name     input     reference cost
======== ========= ========= ====================================================
sbleu    text      yes       1 - sentence BLEU / 100 (sacrebleu, smoothed), [0, 1]  (``text_costs``)
chrf     text      yes       1 - sentence chrF / 100 (sacrebleu; options beta, word_order), [0, 1]
comet    text      yes       1 - COMET (unbabel-comet; source-aware; options model, batch_size)
edit     tokens    yes       min(1, Levenshtein(ŷ, y) / |y|), [0, 1]  (``token_costs``)
rep      tokens    no        1 - unique n-grams / n-grams of ŷ, [0, 1]
nonterm  tokens    no        1 if ŷ contains no EOS else 0
hamming  tokens    yes       Σ_{i<|y|} w(y_i) [ŷ_i != y_i], optionally normalized
======== ========= ========= ====================================================

A cost's options go in parentheses after its name, ``chrf(beta=1)``,
``comet(model=Unbabel/wmt22-comet-da,batch_size=32)`` (``split_options``); a spec is one
cost or a weighted sum, ``edit=1,rep=0.5`` (``parse_task_loss_spec``: the terms, parsed
once per spec and shared).

Your own cost: subclass ``TaskLoss`` in any importable module and name it on the
command line by import path, ``--mgs-task-loss my_costs:QualityCost`` (also inside a
weighted sum, ``my_costs:QualityCost=1,sbleu=0.5``); ``task_loss_class`` resolves it.
A cost may see the source (``needs_source``), run batched on the training device
(``setup``, ``batch_size``, evaluated under ``torch.no_grad``), compute what depends
only on references and sources once per batch (``prepare``), however many candidate
sets are scored against them, and be built with a fairseq model (``needs_model``).

"text" losses take strings that the caller has already BPE-removed and
detokenized (``core.subwords.detect_subword_scheme`` tells which subword segmentation a
vocabulary or a text looks like). "tokens" losses take token sequences (lists or tuples
of ints or strings, or 1-D LongTensors). For ``edit``, ``rep`` and ``hamming`` the caller
strips EOS and padding first; ``nonterm`` needs the EOS kept. "ids" losses take
1-D LongTensors of dictionary ids as decoded (EOS kept, padding removed), for a
cost that runs a model of the same vocabulary.

METEOR is deliberately not provided: it needs WordNet and paraphrase corpora
downloaded at run time. The ``lm`` cost (negative log-probability under a frozen
fairseq scorer) lives in a fairseq adapter, which registers it here with
``@register_task_loss("lm")``.

This module imports torch and ``core.constraints``, no fairseq.
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch

from fairseq_ext.core.constraints import Rule

Token = Union[int, str]
TokenSeq = Union[Sequence[Token], torch.Tensor]

TASK_LOSSES: dict[str, type["TaskLoss"]] = {}


def register_task_loss(name: str) -> Callable[[type["TaskLoss"]], type["TaskLoss"]]:
    """Class decorator adding a ``TaskLoss`` subclass to ``TASK_LOSSES`` under ``name``.

    Usable from any module; registering a name twice raises ``ValueError``.
    """

    def register(cls: type[TaskLoss]) -> type[TaskLoss]:
        if name in TASK_LOSSES:
            raise ValueError(
                f"task loss {name!r} is already registered (by {TASK_LOSSES[name].__qualname__})"
            )
        if not (isinstance(cls, type) and issubclass(cls, TaskLoss)):
            raise TypeError(f"task loss {name!r} must be a subclass of TaskLoss, got {cls!r}")
        _check_kinds(name, cls)
        TASK_LOSSES[name] = cls
        return cls

    return register


INPUT_KINDS = ("text", "tokens", "ids")


def task_loss_names() -> list[str]:
    """Sorted names of all registered task losses (import paths once resolved included)."""
    return sorted(TASK_LOSSES)


def _value(text: str):
    """An option's value: an int, a float, true / false, or the text itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def split_options(name: str) -> tuple[str, dict]:
    """``"chrf(beta=1)"`` -> ("chrf", {"beta": 1}); ``"comet(model=Unbabel/wmt22-comet-da,batch_size=16)"``
    -> ("comet", {"model": "Unbabel/wmt22-comet-da", "batch_size": 16}); a name without
    parentheses has no options. Values are ints, floats, true / false or text. Raises
    ``ValueError`` for a malformed option list."""
    name = name.strip()
    if "(" not in name and ")" not in name:
        return name, {}
    base, _, rest = name.partition("(")
    if not rest.endswith(")") or "(" in rest[:-1] or ")" in rest[:-1]:
        raise ValueError(f"{name!r}: options go in one pair of parentheses, NAME(key=value,...)")
    options = {}
    for item in filter(None, (x.strip() for x in rest[:-1].split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"{name!r}: option {item!r} is not key=value")
        options[key.strip()] = _value(value)
    return base.strip(), options


def task_loss_class(name: str) -> type["TaskLoss"]:
    """The cost class of ``name``: a registered name, or an import path ``module:Class``
    (``module`` importable: installed, or on ``PYTHONPATH``), with options in parentheses
    or without (``chrf(beta=1)``: see ``split_options``). An import path is
    registered under itself the first time it resolves. Raises ``ValueError`` saying
    what is wrong: an unknown name, a module that does not import, a missing
    attribute, or an object that is not a ``TaskLoss`` subclass."""
    return _resolve(split_options(name)[0])


def _resolve(name: str) -> type["TaskLoss"]:
    """``task_loss_class`` of a name without options."""
    if name in TASK_LOSSES:
        return TASK_LOSSES[name]
    module_name, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"{name!r} is not a task loss (registered: {', '.join(task_loss_names())}; "
                         "or your own as module:Class)")
    if not module_name or not attr:
        raise ValueError(f"{name!r} is not an import path module:Class")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{module_name!r} does not import ({err}); is its folder on PYTHONPATH?") from None
    except Exception as err:  # the user's module failed while importing
        raise ValueError(f"importing {module_name!r} failed: {type(err).__name__}: {err}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, TaskLoss)):
        raise ValueError(f"{name!r} is a {type(cls).__name__}, not a subclass of "
                         "fairseq_ext.core.task_losses.TaskLoss")
    _check_kinds(name, cls)
    TASK_LOSSES[name] = cls
    return cls


def _top_level_items(spec: str) -> list[str]:
    """``spec`` split at the commas outside parentheses."""
    items, depth, current = [], 0, ""
    for ch in spec:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return items + [current]


@dataclass(frozen=True)
class CostTerm:
    """One weighted term of a cost spec.

    name: as written, options included (``chrf(beta=1)``): the key of the logged values.
    base: the registered name or import path (``chrf``).
    options: the written options, as (key, value) pairs.
    weight: the term's weight in the sum.
    cls: the ``TaskLoss`` class, resolved once.
    """

    name: str
    base: str
    options: tuple
    weight: float
    cls: type

    def build(self, **options: Any) -> "TaskLoss":
        """The cost, with the written options and the keyword ``options`` (which a caller
        adds: the EOS symbol of ``nonterm``, the model of a ``needs_model`` cost)."""
        options = {**dict(self.options), **options}
        return check_options(self.base, options, complete=True)(**options)


def parse_task_loss_spec(spec: str) -> tuple[CostTerm, ...]:
    """``"sbleu"`` -> (sbleu, weight 1); ``"edit=1,rep=0.5"`` -> (edit, 1.0), (rep, 0.5); a name may
    be the import path of the user's own cost, ``"my_costs:QualityCost=1,sbleu=0.5"``, and may
    carry options, ``"chrf(beta=1)=1,comet(model=Unbabel/wmt22-comet-da)=0.5"``. Each spec is
    parsed once (the option's check and the criterion's build share the result). Raises
    ``ValueError`` saying what is wrong (see ``task_loss_class``; an option the cost does not
    take; a cost that cannot be built here)."""
    return _parse_spec(spec or "")


@functools.lru_cache(maxsize=64)
def _parse_spec(spec: str) -> tuple[CostTerm, ...]:
    terms: list[CostTerm] = []
    for item in _top_level_items(spec):
        item = item.strip()
        if not item:
            raise ValueError(f"{spec!r} has an empty item")
        closed = item.rfind(")") + 1  # a weight follows the options: chrf(beta=1)=0.5
        head, sep, weight = item[closed:].partition("=")
        name = (item[:closed] + head).strip()
        base, options = split_options(name)
        cls = check_options(base, options)
        missing = cls.unavailable()
        if missing:
            raise ValueError(f"{base!r}: {missing}")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"the weight of {name!r} is not a number: {weight!r}") from None
        if not math.isfinite(w):
            raise ValueError(f"the weight of {name!r} is not finite: {weight!r}")
        if any(t.name == name for t in terms):
            raise ValueError(f"{name!r} is given twice")
        terms.append(CostTerm(name, base, tuple(options.items()), w, cls))
    return tuple(terms)


class TaskLossSpec(Rule):
    """The constraint of a ``--*-task-loss`` option: every name resolves (a registered cost or
    the user's ``module:Class``), every weight is a number; the message says what is wrong."""

    def __init__(self) -> None:
        super().__init__(lambda value: True, "a task loss or a weighted sum of them (sbleu; edit=1,rep=0.5; "
                                             "my_costs:MyCost=1,sbleu=0.5)", "nosuchcost")

    def refusal(self, value) -> Optional[str]:
        """Why ``value`` is refused, as plain text completing "--OPTION ...", or None."""
        try:
            parse_task_loss_spec(value)
        except ValueError as err:
            return f"must be {self.text}: {err}"
        return None

    def problem(self, value) -> Optional[str]:
        refusal = self.refusal(value)  # a problem's braces name parameters: the text's are doubled
        return None if refusal is None else refusal.replace("{", "{{").replace("}", "}}")


TASK_LOSS_SPEC = TaskLossSpec()


def _check_kinds(name: str, cls: type) -> None:
    for attr in ("input_kind", "source_kind"):
        kind = getattr(cls, attr)
        if kind is not None and kind not in INPUT_KINDS:
            raise ValueError(f"task loss {name!r}: {attr} must be one of {', '.join(INPUT_KINDS)}, got {kind!r}")
    if cls.batch_size is not None and not (isinstance(cls.batch_size, int) and cls.batch_size >= 1):
        raise ValueError(f"task loss {name!r}: batch_size must be a positive int or None, got {cls.batch_size!r}")
    if cls.device is not None:
        try:
            torch.device(cls.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"task loss {name!r}: device must be None or a torch device such as 'cpu' or 'cuda:1', "
                             f"got {cls.device!r}") from None


def check_options(name: str, options: dict, complete: bool = False) -> type["TaskLoss"]:
    """The class of ``name`` (without options), if it takes the keyword ``options`` (and, with
    ``complete``, needs no other); else ``ValueError`` naming its options."""
    cls = _resolve(name)
    signature = inspect.signature(cls)
    try:
        (signature.bind if complete else signature.bind_partial)(**options)
    except TypeError as err:
        valid = [p for p in signature.parameters if p not in ("args", "kwargs")]
        raise ValueError(
            f"task loss {name!r}: {err}; its options are: {', '.join(valid) or '(none)'}"
        ) from None
    return cls


def build_task_loss(name: str, **options) -> "TaskLoss":
    """Instantiate the task loss ``name`` (registered, or ``module:Class``; options in
    parentheses allowed, ``chrf(beta=1)``) with its options and the keyword ``options``."""
    base, written = split_options(name)
    options = {**written, **options}
    return check_options(base, options, complete=True)(**options)


class TaskLoss:
    """A sequence-level cost Δ(ŷ, y) (or Δ(ŷ, y, x) with the source x), evaluated on a batch.

    Subclasses set ``needs_reference``, ``input_kind`` ("text", "tokens" or "ids")
    and implement ``sentence_cost``; a loss that is cheaper batched (e.g. a model
    scorer) overrides ``batch_cost`` instead. A cost that reads the source sets
    ``needs_source`` (and ``source_kind``, default its ``input_kind``): the source of
    each hypothesis then comes beside it, in that kind (encoder-decoder tasks: the
    source sentence; text completion: the prefix).

    A cost built on a fairseq model sets ``needs_model`` and takes it as ``model``: the
    caller builds it once it has one (the model being trained, frozen when training starts,
    or the checkpoint of the criterion's ``--*-score-model``).

    A neural cost: ``setup(device)`` is called once with the training device (or the
    cost's own ``device``, where it names one) before the first evaluation (move its
    model there and to eval mode; "ids" inputs then arrive on that device); every evaluation
    runs under ``torch.no_grad``, in chunks of at most ``batch_size`` hypotheses
    (None: all at once); ``prepare(refs, sources)`` computes, once per batch, what
    depends only on the references and sources (e.g. their encodings), one item per
    input, and ``batch_cost`` receives the items of its hypotheses' inputs as
    ``prepared``.
    """

    needs_reference: bool = True
    needs_source: bool = False
    input_kind: str = "text"
    source_kind: Optional[str] = None  # None: as input_kind
    batch_size: Optional[int] = None
    device: Optional[str] = None  # None: the training device; e.g. "cpu" keeps the cost off the GPU
    needs_model: bool = False  # built with model=, a frozen fairseq model (``CostTerm.build``)

    def setup(self, device: torch.device) -> None:
        """Called once, before the first evaluation, with the training device (or ``device``)."""

    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why this cost cannot be built here (a package it needs is missing), or None; checked
        when a ``--*-task-loss`` option is parsed, before any work."""
        return None

    def prepare(self, refs: Optional[list], sources: Optional[list]) -> Optional[Sequence]:
        """What depends only on the batch's references and sources: None, or one item per input."""
        return None

    def __call__(self, hyps: Sequence, refs: Optional[Sequence] = None, sources: Optional[Sequence] = None,
                 prepared: Optional[Sequence] = None) -> torch.Tensor:
        """Costs of B hypotheses against B references (and B sources).

        Args:
            hyps: B strings ("text"), B token sequences ("tokens") or B 1-D id tensors ("ids").
            refs: B references of the same kind; required iff ``needs_reference``.
            sources: B sources (``source_kind``); required iff ``needs_source``.
            prepared: B items of ``prepare`` (each hypothesis's input's), or None.

        Returns:
            float32 CPU tensor of shape (B,).
        """
        hyps = [self._check_item(h, "hypothesis") for h in hyps]
        refs = self._check_side(refs, len(hyps), "references", self.needs_reference)
        sources = self._check_side(sources, len(hyps), "sources", self.needs_source, self.source_kind)
        if prepared is not None and len(prepared) != len(hyps):
            raise ValueError(f"{type(self).__name__}: {len(hyps)} hypotheses but {len(prepared)} prepared items")
        step = self.batch_size or max(len(hyps), 1)
        out = []
        with torch.no_grad():
            for i in range(0, len(hyps), step):
                part = slice(i, i + step)
                args = (hyps[part], refs[part] if refs is not None else None)
                if self.needs_source or prepared is not None:
                    costs = self.batch_cost(*args, sources=sources[part] if sources is not None else None,
                                            prepared=prepared[part] if prepared is not None else None)
                else:
                    costs = self.batch_cost(*args)
                out.append(torch.as_tensor(costs, dtype=torch.float32).detach().cpu().reshape(-1))
        costs = torch.cat(out) if out else torch.zeros(0)
        if costs.numel() != len(hyps):
            raise ValueError(f"{type(self).__name__}: {len(hyps)} hypotheses but {costs.numel()} costs")
        return costs

    def batch_cost(self, hyps: list, refs: Optional[list], sources: Optional[list] = None,
                   prepared: Optional[Sequence] = None) -> Union[list[float], torch.Tensor]:
        """B costs; ``refs`` / ``sources`` / ``prepared`` are None or have length B. Defaults
        to a loop over sentences (with the source when the cost needs it)."""
        rs = refs if refs is not None else [None] * len(hyps)
        if self.needs_source:
            return [self.sentence_cost(h, r, x) for h, r, x in zip(hyps, rs, sources)]
        return [self.sentence_cost(h, r) for h, r in zip(hyps, rs)]

    def sentence_cost(self, hyp, ref, source=None) -> float:
        """Cost of one hypothesis against one reference (and its source, with ``needs_source``)."""
        raise NotImplementedError

    aggregatable: bool = False  # whether aggregated_cost is defined

    def aggregated_cost(self, hyps: Sequence, refs: Sequence, weights: Optional[Sequence[float]] = None,
                        source=None) -> torch.Tensor:
        """Costs (H,) of H hypotheses of one input against the aggregate of its R references
        (weights summing to 1; None: uniform), for MBR decoding with reference aggregation:
        ``sbleu`` and ``chrf`` against the expected n-gram counts (``core.ngram_stats``), an
        ``EmbeddingCost`` and ``comet`` (a regression model) against the mean embedding. Other
        costs have no aggregate."""
        raise NotImplementedError(f"{type(self).__name__} has no aggregated form (sbleu, chrf, comet and "
                                  "EmbeddingCost subclasses have)")

    def _check_side(self, items: Optional[Sequence], n: int, role: str, needed: bool,
                    kind: Optional[str] = None) -> Optional[list]:
        if items is None:
            if needed:
                raise ValueError(f"{type(self).__name__} needs {role}, but none were given")
            return None
        checked = [self._check_item(x, role[:-1], kind) for x in items]
        if len(checked) != n:
            raise ValueError(f"{type(self).__name__}: {n} hypotheses but {len(checked)} {role}")
        return checked

    def _check_item(self, item, role: str, kind: Optional[str] = None):
        """Validate one input; token sequences come back as plain lists, ids as 1-D tensors."""
        kind = kind or self.input_kind
        if kind == "ids":
            item = torch.as_tensor(item, dtype=torch.long)
            if item.dim() != 1:
                raise ValueError(f"{type(self).__name__}: each {role} must be a 1-D id tensor, got shape "
                                 f"{tuple(item.shape)}")
            return item
        if kind == "text":
            if not isinstance(item, str):
                raise TypeError(
                    f"{type(self).__name__} takes text: each {role} must be a str, "
                    f"got {type(item).__name__}"
                )
            return item
        if isinstance(item, str):
            raise TypeError(
                f"{type(self).__name__} takes token sequences: split the {role} "
                f"string into tokens first"
            )
        if isinstance(item, torch.Tensor):
            if item.dim() != 1:
                raise ValueError(
                    f"{type(self).__name__}: each {role} tensor must be 1-D, got shape "
                    f"{tuple(item.shape)}"
                )
            return item.tolist()
        return list(item)


class EmbeddingCost(TaskLoss):
    """A neural cost that compares a hypothesis with an embedding of its reference: ``prepare``
    returns one embedding (a tensor) per reference, and ``batch_cost`` reads the references
    only through ``prepared``. Its aggregated form (MBR with reference aggregation, Vamvas
    & Sennrich, 2024) scores every hypothesis against the weighted mean of the references'
    embeddings."""

    aggregatable = True

    def aggregated_cost(self, hyps, refs, weights=None, source=None) -> torch.Tensor:
        refs = [self._check_item(r, "reference") for r in refs]
        sources = [source] * len(refs) if self.needs_source else None
        embeddings = torch.stack([torch.as_tensor(e) for e in self.prepare(refs, sources)])
        w = torch.full((len(refs),), 1.0 / len(refs)) if weights is None else torch.as_tensor(weights, dtype=torch.float)
        mean = (w.to(embeddings) / w.sum()) @ embeddings.reshape(len(refs), -1)
        mean = mean.reshape(embeddings.shape[1:])
        return self(hyps, [refs[0]] * len(hyps), [source] * len(hyps) if self.needs_source else None,
                    prepared=[mean] * len(hyps))
