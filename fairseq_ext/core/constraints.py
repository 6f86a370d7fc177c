"""What values a parameter accepts, declared once beside it; pure Python.

A dataclass field declares its constraint in its metadata,
``field(default=4, metadata={"constraint": at_least(1)})``, and
``check_fields(obj)`` enforces every declared constraint of a dataclass instance;
a function (or class) declares those of its arguments with
``@declare(topk=at_least(0))`` and checks them with ``check_arguments``.
A bad value raises ``ParameterError``, which names the *parameter*
(``num_candidates must be >= 1, got 0``), never a command-line option: the plugin
maps parameters to its options (``fairseq_ext.runtime.validation``). A rule that
ties several parameters together (checked in code) raises ``ParameterError`` too,
naming the others as ``{name}`` in its text, so that they can be shown as options.

``None`` always passes: it means "not set" (an optional parameter, a feature off).
"""
import dataclasses
import string
from typing import Any, Callable, Iterable, Optional, Sequence

CONSTRAINT = "constraint"  # the metadata key of a field's constraint


class ParameterError(ValueError):
    """A parameter value the math does not accept.

    owner: the class or function the parameter belongs to (``ProposalConfig``).
    parameter: its name (``num_candidates``).
    problem: what is wrong, e.g. ``must be >= 1, got 0``; other parameters it
        mentions are written ``{name}`` (``and {anneal_floor_at} are two schedules``),
        a literal brace doubled.
    """

    def __init__(self, owner: Any, parameter: str, problem: str):
        self.owner, self.parameter, self.problem = owner, parameter, problem
        super().__init__(self.describe(lambda name: name))

    def mentioned(self) -> Sequence[str]:
        """The other parameters ``problem`` names (``{name}`` fields)."""
        return [name for _, name, _, _ in string.Formatter().parse(self.problem) if name]

    def describe(self, show: Callable[[str], str]) -> str:
        """The message, with every parameter written as ``show(name)``."""
        return f"{show(self.parameter)} " + self.problem.format(**{n: show(n) for n in self.mentioned()})


class Constraint:
    """A rule on one value; ``problem(value)`` is None when it holds."""

    def problem(self, value: Any) -> Optional[str]:
        raise NotImplementedError

    def rule(self) -> str:
        """What the value must be, completing "must be ..." (``> 0``, ``in [0, 1]``)."""
        raise NotImplementedError


def _shown(value: Any) -> str:
    """``value`` as a problem shows it (braces doubled: ``{name}`` in a problem is a parameter)."""
    return repr(value).replace("{", "{{").replace("}", "}}")


class Range(Constraint):
    """low <= value <= high (either bound may be open or absent)."""

    def __init__(self, low: Optional[float] = None, high: Optional[float] = None, low_open: bool = False,
                 high_open: bool = False):
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def holds(self, value: Any) -> bool:
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        if self.high is not None and not (value < self.high if self.high_open else value <= self.high):
            return False
        return True

    def text(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

    def problem(self, value: Any) -> Optional[str]:
        return None if self.holds(value) else f"must be {self.text()}, got {_shown(value)}"

    def rule(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Range({self.text()})"


def at_least(low: float) -> Range:
    """value >= low."""
    return Range(low=low)


def above(low: float) -> Range:
    """value > low."""
    return Range(low=low, low_open=True)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Range:
    """value in [low, high], each end closed unless said open."""
    return Range(low, high, low_open, high_open)


class OneOf(Constraint):
    """value is one of ``choices``."""

    def __init__(self, choices: Iterable):
        self.choices = tuple(choices)

    def problem(self, value: Any) -> Optional[str]:
        return None if value in self.choices else f"must be {self.rule()}, got {_shown(value)}"

    def rule(self) -> str:
        return f"one of {self.choices}"

    def __repr__(self) -> str:
        return f"OneOf{self.choices}"


class Rule(Constraint):
    """Any other rule: ``test(value)`` holds; ``text`` completes "must be ...";
    ``counterexample`` is a value it refuses (for tests and docs)."""

    def __init__(self, test: Callable[[Any], bool], text: str, counterexample: Any):
        self.test, self.text, self.counterexample = test, text, counterexample

    def problem(self, value: Any) -> Optional[str]:
        return None if self.test(value) else f"must be {self.text}, got {_shown(value)}"

    def rule(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Rule({self.text})"


def declare(**constraints: Constraint) -> Callable:
    """Decorator: the constraints of the arguments of a function or class
    (``@declare(decay=between(0, 1, high_open=True))``), which it checks by
    calling ``check_arguments``."""
    def mark(owner):
        owner.__constraints__ = {**getattr(owner, "__constraints__", {}), **constraints}
        return owner
    return mark


def constraint_of(owner: Any, name: str) -> Optional[Constraint]:
    """The constraint declared for parameter ``name`` of ``owner``: a field of a
    dataclass, or an argument of a function or class marked with ``declare``
    (None: none)."""
    if dataclasses.is_dataclass(owner):
        return owner.__dataclass_fields__[name].metadata.get(CONSTRAINT)
    return getattr(owner, "__constraints__", {}).get(name)


def check_value(owner: Any, name: str, value: Any, constraint: Optional[Constraint]) -> None:
    """Raise ParameterError if ``value`` of parameter ``name`` breaks ``constraint``."""
    if constraint is None or value is None:
        return
    problem = constraint.problem(value)
    if problem is not None:
        raise ParameterError(owner, name, problem)


def check_arguments(owner: Any, **values: Any) -> None:
    """Check the arguments ``values`` of ``owner`` against its declared constraints
    (``declare``); raise ParameterError for the first broken one."""
    for name, value in values.items():
        check_value(owner, name, value, constraint_of(owner, name))


def check_fields(obj: Any) -> Any:
    """Check every declared constraint of the dataclass instance ``obj``, in field
    order; raise ParameterError (owner: its class) for the first broken one. Returns ``obj``."""
    for f in dataclasses.fields(obj):
        check_value(type(obj), f.name, getattr(obj, f.name), f.metadata.get(CONSTRAINT))
    return obj
