"""Old spellings of renamed plugin options: saved checkpoints load with them; the command
line names the new spelling.

Every option a plugin component declares begins with that component's prefix
(``--mgs-``, ``--soft-beam-``, ``--residual-``, ``--tagging-``, ``--search-``,
...), or ``--decoding-`` for the one every decoding criterion shares
(``--decoding-path``); options that mean what fairseq's option of the same name means keep
fairseq's name (``--label-smoothing``, ``--max-source-positions``, the model
sizes). A config field that was renamed declares its old flag(s) in its
metadata, beside its help:

    soft_beam_normalization: ... = field(..., metadata={"help": ..., "deprecated": "--normalization"})

and the old spelling serves in two places:

* in a checkpoint saved before the rename (``upgrade_checkpoint_cfg``, called on
  every checkpoint fairseq loads): the old key of a plugin component's saved
  config is moved to the new one, so that fairseq's merge with the config class
  neither refuses nor silently drops it;
* on the command line (``refuse_old_spellings``, called by the plugin's wrapper of
  fairseq's parser): when the component that owns it is chosen (``--task``,
  ``--criterion``, ``--arch``), the old flag stops the command before any work with
  one line that names the new one, e.g.
  ``fairseq-train: error: --normalization was renamed --soft-beam-normalization``;
  with another component the old name means whatever that component means by it
  (fairseq's wav2vec has its own ``--num-negatives``).
"""
import argparse
import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence

DEPRECATED = "deprecated"  # metadata key: the old flag, or a tuple of old flags, of a renamed option


def _flag_name(flag: str) -> str:
    """``--hamming-weights`` -> ``hamming_weights`` (the config key of a flag)."""
    return flag.lstrip("-").replace("-", "_")


def renamed_fields(config: type) -> Dict[str, str]:
    """{old flag: new field name} of the dataclass ``config``."""
    out = {}
    for f in dataclasses.fields(config):
        old = f.metadata.get(DEPRECATED)
        for flag in ((old,) if isinstance(old, str) else tuple(old or ())):
            out[flag] = f.name
    return out


class _Choices(argparse.ArgumentParser):
    def error(self, message):  # a malformed command line: fairseq's own parser reports it
        raise ValueError(message)


def _chosen(argv: Sequence[str], parser: Optional[argparse.ArgumentParser]) -> argparse.Namespace:
    """The ``--task``, ``--criterion`` and ``--arch`` that ``argv`` names, or else
    ``parser``'s defaults (a script's ``get_generation_parser(default_task=...)``)."""
    p = _Choices(add_help=False, allow_abbrev=False)
    for flags in (("--task",), ("--criterion",), ("--arch", "-a")):
        p.add_argument(*flags, default=parser.get_default(flags[0][2:]) if parser is not None else None)
    try:
        return p.parse_known_args([a for a in argv if a not in ("-h", "--help")])[0]
    except ValueError:
        return argparse.Namespace(task=None, criterion=None, arch=None)


def renamed_options(argv: Sequence[str], parser: Optional[argparse.ArgumentParser] = None) -> Dict[str, str]:
    """{old flag: new flag} of the components ``argv`` (or ``parser``'s defaults) chooses."""
    from fairseq_ext.runtime.validation import chosen_configs, flag

    out = {}
    for config in chosen_configs(_chosen(argv, parser)):
        out.update({old: flag(name) for old, name in renamed_fields(config).items()})
    return out


def refuse_old_spellings(argv: Sequence[str], parser: Optional[argparse.ArgumentParser] = None) -> None:
    """Stop, with one line naming the new spelling (exit 2), at the first old flag of the components
    ``argv`` chooses (``--old VALUE`` or ``--old=VALUE``; nothing after ``--``)."""
    renames = renamed_options(argv, parser)
    for arg in argv:
        if arg == "--":
            return
        name = arg.partition("=")[0]
        if name.startswith("--") and name in renames:
            message = f"{name} was renamed {renames[name]}"
            if parser is not None:
                parser.exit(2, f"{parser.prog}: error: {message}\n")
            from fairseq_ext.runtime.cli import ConfigError
            raise ConfigError(message)


def _component_config(section: Mapping, kind: str) -> Optional[type]:
    from fairseq_ext.runtime.validation import chosen_configs

    name = section.get("_name") if hasattr(section, "get") else None
    if not isinstance(name, str):
        return None
    configs = chosen_configs(argparse.Namespace(**{kind: name}))
    return configs[0] if configs else None


def upgrade_checkpoint_cfg(cfg: Any, overrides: Optional[Mapping[str, Any]] = None) -> Any:
    """Move the old keys of the plugin components' sections (task, criterion, model)
    of a checkpoint's ``cfg`` (an OmegaConf DictConfig) to their new names, in place;
    a key already under its new name is kept. ``overrides`` (fairseq's
    ``arg_overrides``, which set only keys the checkpoint has) also set the moved
    keys. Returns ``cfg``."""
    from omegaconf import open_dict

    if cfg is None or not hasattr(cfg, "get"):
        return cfg
    for section_name, kind in (("task", "task"), ("criterion", "criterion"), ("model", "arch")):
        section = cfg.get(section_name)
        config = _component_config(section, kind) if section is not None else None
        if config is None:
            continue
        with open_dict(section):
            for old, new in renamed_fields(config).items():
                key = _flag_name(old)
                if key in section and key != new:
                    value = section.pop(key)
                    if new not in section:
                        section[new] = (overrides or {}).get(new, value)
    return cfg
