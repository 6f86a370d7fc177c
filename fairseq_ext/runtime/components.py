"""Every plugin component (criterion, task, model) fairseq has registered, and the options
each adds to fairseq's parser, with its default, declared rule and help: what
``python -m fairseq_ext.options`` prints and what the parser's one-line errors recognise
as a plugin option."""
import argparse
import functools
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Sequence

PLUGIN = "fairseq_ext"


class Component(NamedTuple):
    kind: str  # criterion, task or model
    name: str
    cls: type
    archs: Sequence[str] = ()  # a model's registered architectures


class Option(NamedTuple):
    flags: Sequence[str]  # ("--mgs-alpha",), ("data",) for a positional
    default: object
    choices: Optional[Sequence]
    help: str
    declared_by: str  # the config class that declares the field, e.g. "MGSConfig"
    rule: str = ""  # the declared constraint, completing "must be ..." ("> 0"), or ""


def is_plugin(cls: type) -> bool:
    """Whether a class is defined in this package (a plugin component, not fairseq's)."""
    return cls.__module__ == PLUGIN or cls.__module__.startswith(PLUGIN + ".")


def plugin_components() -> List[Component]:
    """The registered criterions, tasks and models defined in this package, in that order."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    out = [Component(kind, name, cls) for kind, registry in (("criterion", CRITERION_REGISTRY), ("task", TASK_REGISTRY))
           for name, cls in sorted(registry.items()) if is_plugin(cls)]
    for name, cls in sorted(MODEL_REGISTRY.items()):
        if is_plugin(cls):
            out.append(Component("model", name, cls, tuple(sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m is cls))))
    return out


def _option(action: argparse.Action, config) -> Option:
    """``action``'s option, with the default and declaring class of the field of ``config`` (a
    dataclass instance) it comes from (a model's ``add_args`` leaves the parser's defaults unset)."""
    from fairseq_ext.runtime.validation import option_constraint

    for klass in (type(config).__mro__ if config is not None else ()):
        if action.dest in vars(klass).get("__annotations__", {}):
            default = config._get_default(action.dest)
            constraint = option_constraint(config.__dataclass_fields__[action.dest])
            return Option(tuple(action.option_strings) or (action.dest,), default, action.choices, action.help or "",
                          klass.__name__, constraint.rule() if constraint is not None else "")
    return Option(tuple(action.option_strings) or (action.dest,), action.default, action.choices, action.help or "", "")


def component_options(component: Component) -> List[Option]:
    """The options fairseq adds for ``component`` (its ``add_args`` on an empty parser)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    component.cls.add_args(parser)
    config = getattr(component.cls, "__dataclass", None)
    return [_option(action, config and config()) for action in parser._actions]


@functools.lru_cache(maxsize=1)
def flag_owners() -> Dict[str, Component]:
    """Every option string a plugin component adds (``--mgs-alpha``, ``--completion-context-size``, ...),
    with the component that adds it."""
    return {f: c for c in plugin_components() for o in component_options(c) for f in o.flags}


@functools.lru_cache(maxsize=1)
def plugin_flags() -> FrozenSet[str]:
    """Every option string a plugin component adds."""
    return frozenset(flag_owners())
