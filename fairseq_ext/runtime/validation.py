"""The plugin's option rules, declared once, checked by one helper.

A field of a component's config dataclass (criterion, task, model; the
generators are configured through their tasks) declares what it accepts in its
metadata, beside its help:

* ``"constraint": above(0)`` (``fairseq_ext.core.constraints``): a rule of the
  plugin's own option (``--mgs-alpha``);
* ``"parameter": (ProposalConfig, "num_candidates")``: the option *is* that
  parameter of the math (a field of a ``core`` dataclass, or an argument of a
  ``core`` function), and takes the constraint declared there. Core code raises
  ``ParameterError`` naming its parameter; this link says which option it is.

Choices are ``ChoiceEnum`` fields built from the core's constants; argparse
checks them.

``check_options(Config, values)`` checks every declared constraint and raises
``ConfigError`` naming the option (``--mgs-candidates must be >= 1, got 0``), so
the command ends with that one line, exit status 2 (``runtime.cli``). It runs
right after fairseq parses the command line (``check_parsed``, before fairseq
creates ``--save-dir``, reads data or builds anything) and again when a component
is built from Python. ``as_options(Config)`` turns a ``ParameterError`` that the
core raises inside it (a rule that ties parameters together, e.g. the decay of
``--dss-schedule``) into the same one-line error.
"""
import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from fairseq_ext.core.constraints import CONSTRAINT, Constraint, ParameterError, check_value, constraint_of
from fairseq_ext.runtime.cli import ConfigError

PARAMETER = "parameter"  # metadata key: (core owner, parameter name) an option stands for


def flag(name: str) -> str:
    """The command-line option of config field ``name``: ``mgs_alpha`` -> ``--mgs-alpha``."""
    return "--" + name.replace("_", "-")


def option_constraint(f: dataclasses.Field) -> Optional[Constraint]:
    """The constraint of a config field: its own, or that of the core parameter it stands for."""
    own = f.metadata.get(CONSTRAINT)
    if own is not None:
        return own
    owner, name = f.metadata.get(PARAMETER, (None, None))
    return None if owner is None else constraint_of(owner, name)


def constrained_options(config: type) -> List[Tuple[dataclasses.Field, Constraint]]:
    """(field, constraint) of every field of the dataclass ``config`` that declares one."""
    out = []
    for f in dataclasses.fields(config):
        c = option_constraint(f)
        if c is not None:
            out.append((f, c))
    return out


def _links(config: type) -> Dict[Tuple[Any, str], str]:
    """{(core owner, parameter): the field of ``config`` that stands for it}."""
    return {tuple(f.metadata[PARAMETER]): f.name for f in dataclasses.fields(config) if PARAMETER in f.metadata}


def config_error(config: type, error: ParameterError) -> ConfigError:
    """``error`` (raised by the core, or by a field of ``config``) as the ConfigError of the options."""
    links = _links(config)
    own = {f.name for f in dataclasses.fields(config)} if error.owner is config else set()

    def show(name: str) -> str:
        field_name = links.get((error.owner, name), name if name in own else None)
        return flag(field_name) if field_name else name

    return ConfigError(error.describe(show))


def _value(values: Any, name: str) -> Tuple[bool, Any]:
    if isinstance(values, Mapping):
        return (name in values, values.get(name))
    try:
        return True, getattr(values, name)
    except AttributeError:
        return False, None


def check_options(config: type, values: Any) -> None:
    """Check ``values`` (a mapping, an argparse Namespace, a config object) against the
    constraints declared on the fields of ``config``, in field order; raise ConfigError
    naming the option of the first broken one. Fields absent from ``values`` are skipped."""
    for f, constraint in constrained_options(config):
        present, value = _value(values, f.name)
        if not present:
            continue
        try:
            check_value(config, f.name, value, constraint)
        except ParameterError as e:
            raise config_error(config, e) from None


@contextlib.contextmanager
def as_options(config: type) -> Iterator[None]:
    """Inside the block, a ParameterError of a core parameter that a field of ``config``
    stands for (or of ``config`` itself) is raised as a ConfigError naming the option."""
    try:
        yield
    except ParameterError as e:
        links = _links(config)
        if (e.owner, e.parameter) not in links and e.owner is not config:
            raise
        raise config_error(config, e) from None


def chosen_components(args: Any) -> List[type]:
    """The classes of the task, model (``--arch``) and criterion ``args`` chose."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    out = []
    for registry, key in ((TASK_REGISTRY, "task"), (ARCH_MODEL_REGISTRY, "arch"), (CRITERION_REGISTRY, "criterion")):
        name = getattr(args, key, None)
        if isinstance(name, str) and name in registry:
            out.append(registry[name])
    return out


def chosen_configs(args: Any) -> List[type]:
    """The config dataclasses of the task, model (``--arch``) and criterion ``args`` chose."""
    configs = [getattr(cls, "__dataclass", None) for cls in chosen_components(args)]
    return [c for c in configs if c is not None and dataclasses.is_dataclass(c)]


def check_parsed(args: Any) -> None:
    """``check_options`` for every component a parsed command line chose (fairseq's
    own components declare no constraint)."""
    for config in chosen_configs(args):
        check_options(config, args)
