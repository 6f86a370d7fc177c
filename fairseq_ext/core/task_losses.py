"""Sequence-level task losses (costs) Δ(ŷ, y) with a batched API.

Every loss maps a batch of B hypotheses (and, when it needs them, B references)
to a float32 CPU tensor of shape (B,) of per-sequence costs; lower is better.

======== ========= ========= ====================================================
name     input     reference cost
======== ========= ========= ====================================================
sbleu    text      yes       1 - sentence BLEU / 100 (sacrebleu, smoothed), [0, 1]
chrf     text      yes       1 - sentence chrF / 100 (sacrebleu; options beta, word_order), [0, 1]
comet    text      yes       1 - COMET (unbabel-comet; source-aware; options model, batch_size)
edit     tokens    yes       min(1, Levenshtein(ŷ, y) / |y|), [0, 1]
rep      tokens    no        1 - unique n-grams / n-grams of ŷ, [0, 1]
nonterm  tokens    no        1 if ŷ contains no EOS else 0
hamming  tokens    yes       Σ_{i<|y|} w(y_i) [ŷ_i != y_i], optionally normalized
======== ========= ========= ====================================================

A cost's options go in parentheses after its name, ``chrf(beta=1)``,
``comet(model=Unbabel/wmt22-comet-da,batch_size=32)`` (``split_options``).

Your own cost: subclass ``TaskLoss`` in any importable module and name it on the
command line by import path, ``--mgs-task-loss my_costs:QualityCost`` (also inside a
weighted sum, ``my_costs:QualityCost=1,sbleu=0.5``); ``task_loss_class`` resolves it.
A cost may see the source (``needs_source``), run batched on the training device
(``setup``, ``batch_size``, evaluated under ``torch.no_grad``) and compute what depends
only on references and sources once per batch (``prepare``), however many candidate
sets are scored against them.

"text" losses take strings that the caller has already BPE-removed and
detokenized (``detect_subword_scheme`` tells which subword segmentation a
vocabulary or a text looks like, so callers can check). "tokens" losses take token sequences (lists or tuples of ints or
strings, or 1-D LongTensors). For ``edit``, ``rep`` and ``hamming`` the caller
strips EOS and padding first; ``nonterm`` needs the EOS kept. "ids" losses take
1-D LongTensors of dictionary ids as decoded (EOS kept, padding removed), for a
cost that runs a model of the same vocabulary.

METEOR is deliberately not provided: it needs WordNet and paraphrase corpora
downloaded at run time. The ``lm`` cost (negative log-probability under a frozen
fairseq scorer) lives in a fairseq adapter, which registers it here with
``@register_task_loss("lm")``.

This module imports torch and ``core.constraints`` (sacrebleu and editdistance
lazily, when a loss that needs them is built), no fairseq.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable, Iterable, Optional, Sequence, Union

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
    name = split_options(name)[0]
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


def parse_task_loss_spec(spec: str) -> dict[str, float]:
    """``"sbleu"`` -> {"sbleu": 1.0}; ``"edit=1,rep=0.5"`` -> {"edit": 1.0, "rep": 0.5}; a name may
    be the import path of the user's own cost, ``"my_costs:QualityCost=1,sbleu=0.5"``, and may
    carry options, ``"chrf(beta=1)=1,comet(model=Unbabel/wmt22-comet-da)=0.5"`` (the keys of
    the result are the names as written, options included). Raises ``ValueError`` saying what
    is wrong (see ``task_loss_class``; an option the cost does not take)."""
    out: dict[str, float] = {}
    for item in _top_level_items(spec or ""):
        item = item.strip()
        if not item:
            raise ValueError(f"{spec!r} has an empty item")
        closed = item.rfind(")") + 1  # a weight follows the options: chrf(beta=1)=0.5
        head, sep, weight = item[closed:].partition("=")
        name = (item[:closed] + head).strip()
        base, options = split_options(name)
        missing = check_options(base, options).unavailable()
        if missing:
            raise ValueError(f"{base!r}: {missing}")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"the weight of {name!r} is not a number: {weight!r}") from None
        if not math.isfinite(w):
            raise ValueError(f"the weight of {name!r} is not finite: {weight!r}")
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        out[name] = w
    return out


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
    cls = task_loss_class(name)
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


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


@register_task_loss("sbleu")
class SentenceBleuCost(TaskLoss):
    """1 - sBLEU / 100, sacrebleu's smoothed sentence BLEU with effective order."""

    needs_reference = True
    input_kind = "text"

    aggregatable = True

    def __init__(self, smooth_method: str = "exp", smooth_value: Optional[float] = None) -> None:
        from sacrebleu.metrics import BLEU

        from fairseq_ext.core.ngram_stats import BleuStats

        self.bleu = BLEU(
            smooth_method=smooth_method, smooth_value=smooth_value, effective_order=True
        )
        self.stats = BleuStats(self.bleu)  # sacrebleu's sentence_score, each sentence counted once

    def sentence_cost(self, hyp: str, ref: str) -> float:
        return _clamp01(1.0 - self.stats.score(hyp, ref) / 100.0)

    def aggregated_cost(self, hyps, refs, weights=None, source=None) -> torch.Tensor:
        aggregate = self.stats.aggregate(refs, weights)
        return torch.tensor([_clamp01(1.0 - self.stats.score_aggregate(h, aggregate) / 100.0) for h in hyps])


@register_task_loss("chrf")
class ChrfCost(TaskLoss):
    """1 - chrF / 100, sacrebleu's sentence chrF (character 6-grams; ``beta`` weights recall
    beta times as much as precision: 2, sacrebleu's default, rewards long hypotheses; 1
    weights both alike; ``word_order`` 2 is chrF++)."""

    needs_reference = True
    input_kind = "text"

    def __init__(self, beta: float = 2, word_order: int = 0) -> None:
        from sacrebleu.metrics import CHRF

        from fairseq_ext.core.ngram_stats import ChrfStats

        if not beta > 0:
            raise ValueError(f"chrf: beta must be > 0, got {beta}")
        self.chrf = CHRF(beta=beta, word_order=word_order)
        self.stats = ChrfStats(self.chrf)  # sacrebleu's sentence_score, each sentence counted once

    aggregatable = True

    def sentence_cost(self, hyp: str, ref: str) -> float:
        return _clamp01(1.0 - self.stats.score(hyp, ref) / 100.0)

    def aggregated_cost(self, hyps, refs, weights=None, source=None) -> torch.Tensor:
        aggregate = self.stats.aggregate(refs, weights)
        return torch.tensor([_clamp01(1.0 - self.stats.score_aggregate(h, aggregate) / 100.0) for h in hyps])


@register_task_loss("comet")
class CometCost(TaskLoss):
    """1 - COMET (Rei et al., 2020), a learned metric that reads the source, the hypothesis
    and the reference, from the ``unbabel-comet`` package (``pip install unbabel-comet``);
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
        self.batch_size = batch_size
        self.devices: Optional[list] = None  # None: COMET's predict on the CPU
        # reference aggregation needs a regression model's estimator over the sentence embeddings of
        # the source, the hypothesis and the reference (wmt22-comet-da and the other RegressionMetric models)
        estimate = getattr(self.model, "estimate", None)
        self.aggregatable = (callable(estimate) and hasattr(self.model, "get_sentence_embedding")
                             and hasattr(getattr(self.model, "encoder", None), "prepare_sample")
                             and "ref_sentemb" in inspect.signature(estimate).parameters)

    def setup(self, device: torch.device) -> None:
        device = torch.device(device)
        self.devices = [device.index or 0] if device.type == "cuda" else None
        self.model.eval()

    def batch_cost(self, hyps: list, refs: list, sources: Optional[list] = None, prepared=None) -> torch.Tensor:
        data = [{"src": x, "mt": h, "ref": r} for h, r, x in zip(hyps, refs, sources)]
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


@register_task_loss("edit")
class EditCost(TaskLoss):
    """min(1, Levenshtein(ŷ, y) / |y|); for empty y: 0 if ŷ is empty else 1.

    The caller strips EOS and padding.
    """

    needs_reference = True
    input_kind = "tokens"

    def __init__(self) -> None:
        import editdistance

        self.distance = editdistance.eval

    def sentence_cost(self, hyp: list[Token], ref: list[Token]) -> float:
        if not ref:
            return 0.0 if not hyp else 1.0
        return min(1.0, self.distance(hyp, ref) / len(ref))


@register_task_loss("rep")
class RepetitionCost(TaskLoss):
    """1 - (unique n-grams of ŷ) / (n-grams of ŷ); 0 when |ŷ| < n.

    The caller strips EOS and padding.
    """

    needs_reference = False
    input_kind = "tokens"

    def __init__(self, n: int = 4) -> None:
        if n < 1:
            raise ValueError(f"rep: n must be >= 1, got {n}")
        self.n = n

    def sentence_cost(self, hyp: list[Token], ref: Optional[list[Token]]) -> float:
        return 1.0 - unique_ngram_share([hyp], self.n)


def unique_ngram_share(sequences: Sequence[Sequence[Token]], n: int, pooled: bool = True) -> float:
    """Share of unique n-grams: distinct n-grams / all n-grams, in [0, 1] (1: nothing repeats).

    The n-grams of each sequence are taken inside it (none spans two sequences).
    pooled: over the whole set, an n-gram counting once however many sequences
        hold it: the diversity of a set of samples (Deng et al., 2020, Figure 2
        right, compares sets of equal size this way). Otherwise the mean over the
        sequences of at least n tokens of their own share (1 - the ``rep`` cost):
        repetition inside a sequence only.
    Returns 1.0 when no sequence has n tokens.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [[tuple(s[i : i + n]) for i in range(len(s) - n + 1)] for s in sequences]
    grams = [g for g in grams if g]
    if not grams:
        return 1.0
    if pooled:
        return len({x for g in grams for x in g}) / sum(len(g) for g in grams)
    return sum(len(set(g)) / len(g) for g in grams) / len(grams)


@register_task_loss("nonterm")
class NonTerminationCost(TaskLoss):
    """1 if the hypothesis contains no ``eos`` token (it did not terminate), else 0."""

    needs_reference = False
    input_kind = "tokens"

    def __init__(self, eos: Token) -> None:
        self.eos = eos

    def sentence_cost(self, hyp: list[Token], ref: Optional[list[Token]]) -> float:
        return 0.0 if self.eos in hyp else 1.0


@register_task_loss("hamming")
class HammingCost(TaskLoss):
    """Weighted Hamming cost over the reference horizon.

    Δ(ŷ, y) = Σ_{i < |y|} w(y_i) [ŷ_i != y_i], where a missing ŷ_i (ŷ shorter
    than y) is a mismatch and positions past |y| are ignored. ``weights`` maps
    a label to its weight (default 1.0), e.g. {"O": 2.0}; its keys must have the
    type of the tokens (str labels or int ids). With ``normalize`` the sum is
    divided by Σ_i w(y_i), which is |y| for unit weights and keeps the cost in
    [0, 1]; an empty reference costs 0. The caller strips EOS and padding.
    """

    needs_reference = True
    input_kind = "tokens"

    def __init__(
        self, weights: Optional[dict[Token, float]] = None, normalize: bool = False
    ) -> None:
        self.weights = dict(weights or {})
        for label, w in self.weights.items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"hamming: weight of {label!r} must be finite and >= 0, got {w}")
        self.normalize = normalize

    def sentence_cost(self, hyp: list[Token], ref: list[Token]) -> float:
        w = [self.weights.get(label, 1.0) for label in ref]
        cost = sum(wi for i, wi in enumerate(w) if i >= len(hyp) or hyp[i] != ref[i])
        if self.normalize:
            total = sum(w)
            return cost / total if total > 0 else 0.0
        return float(cost)


def parse_label_weights(spec: str) -> dict[str, float]:
    """Parse ``"O=2.0,B-PER=1.5"`` into ``{"O": 2.0, "B-PER": 1.5}``.

    Whitespace around items is ignored; an empty or blank spec gives ``{}``. The
    label is everything before the last ``=``. Raises ``ValueError`` for an item
    without ``=``, an empty label, a weight that is not a finite number >= 0,
    or a label given twice.
    """
    weights: dict[str, float] = {}
    if not spec.strip():
        return weights
    for item in spec.split(","):
        item = item.strip()
        label, sep, value = item.rpartition("=")
        label = label.strip()
        if not sep:
            raise ValueError(
                f"label weight {item!r} in {spec!r} is not of the form LABEL=WEIGHT"
            )
        if not label:
            raise ValueError(f"label weight {item!r} in {spec!r} has an empty label")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(
                f"label weight {item!r} in {spec!r}: {value.strip()!r} is not a number"
            ) from None
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"label weight {item!r} in {spec!r}: weight must be finite and >= 0")
        if label in weights:
            raise ValueError(f"label {label!r} is given twice in {spec!r}")
        weights[label] = weight
    return weights


SUBWORD_MARKS = {
    "sentencepiece": "start with '\u2581'",  # word-initial pieces carry U+2581 (LOWER ONE EIGHTH BLOCK)
    "subword_nmt": "end with '@@'",  # word-internal pieces are followed by '@@'
}


def detect_subword_scheme(symbols: Iterable[str], min_share: float = 0.05) -> tuple[Optional[str], float]:
    """Which subword segmentation ``symbols`` look like, with the share of them marked.

    symbols: a vocabulary's symbols (special symbols left out) or the whitespace
        tokens of a text.
    Returns ``("sentencepiece", share)`` when the share of symbols starting with
    U+2581 is the larger mark and at least ``min_share``, ``("subword_nmt",
    share)`` likewise for symbols ending in ``@@``, else ``(None, larger share)``.
    Neither mark occurs in ordinary words, so a real subword vocabulary is far
    above the 5% default (sentencepiece: most words start a piece; subword-nmt:
    every split word leaves an ``@@`` piece), and a word vocabulary is at 0.
    """
    n = sp = bpe = 0
    for s in symbols:
        n += 1
        sp += s.startswith("\u2581")
        bpe += s.endswith("@@")
    if n == 0:
        return None, 0.0
    scheme, share = ("sentencepiece", sp / n) if sp >= bpe else ("subword_nmt", bpe / n)
    return (scheme if share > 0 and share >= min_share else None), share
