"""fairseq's parser (``fairseq.options.parse_args_and_arch``) with the plugin's changes
(installed on import of the plugin; ``runtime.cli``'s docstring lists them): old option
spellings read as their new names (``runtime.renamed``), an argparse error about a
plugin option in one line, a complete ``--help``, the parsed options checked against
their declared rules (``runtime.validation``), and, where the command chooses one of the
plugin's components, ``runtime.fixes.activate``. A ``--restore-file`` that does not exist
keeps fairseq's meaning (training starts from scratch) with one warning line naming it.
"""
import argparse
import functools
import logging
import os
import re
import sys
from typing import Any, Callable, List, Optional

from fairseq_ext.runtime import fixes
from fairseq_ext.runtime.components import flag_owners, is_plugin, plugin_flags
from fairseq_ext.runtime.renamed import refuse_old_spellings
from fairseq_ext.runtime.validation import check_parsed, chosen_components

HELP_FLAGS = ("-h", "--help")


def _names_plugin_option(message: str) -> bool:
    """Whether an argparse error message is about an option a plugin component adds
    (``argument --mgs-decoder: invalid choice: ...``)."""
    m = re.match(r"argument (\S+): ", message)
    return bool(m) and any(flag in plugin_flags() for flag in m.group(1).split("/"))


def _plugin_prefixes() -> frozenset:
    """The first words of the plugin's options (``--mrt-``, ``--dss-``, ...) that no fairseq
    option starts with."""
    return frozenset(f.split("-")[2] for f in plugin_flags() if f.startswith("--") and f.count("-") >= 3)


def _misspelled_plugin_option(message: str) -> Optional[str]:
    """For argparse's ``unrecognized arguments: ...`` naming an option with a plugin prefix
    (``--mrt-candiates``): one line naming it and the closest plugin options; else None."""
    if not message.startswith("unrecognized arguments: "):
        return None
    import difflib

    prefixes = _plugin_prefixes()
    unknown = [w.split("=")[0] for w in message.split()[2:]
               if w.startswith("--") and w.count("-") >= 3 and w.split("-")[2] in prefixes]
    if not unknown:
        return None
    owners = flag_owners()
    parts = []
    for flag in unknown:
        if flag in owners:  # a real option of a component the command does not select
            owner = owners[flag]
            parts.append(f"{flag} (an option of --{owner.kind if owner.kind != 'model' else 'arch'} "
                         f"{owner.name if owner.kind != 'model' else '/'.join(owner.archs[:2])}, which this "
                         "command does not select)")
            continue
        close = difflib.get_close_matches(flag, sorted(owners), n=3, cutoff=0.6)
        parts.append(f"{flag}" + (f" (did you mean {' or '.join(close)}?)" if close else
                                  f" (no {flag.split('-')[2]} option is close; --help lists them)"))
    return "unrecognized option " + ", ".join(parts)


def chooses_plugin_component(args: Any) -> bool:
    """Whether parsed options choose a plugin task, model (``--arch``) or criterion."""
    return any(is_plugin(cls) for cls in chosen_components(args))


def _warn_missing_restore_file(args: Any) -> None:
    """fairseq trains from scratch when ``--restore-file`` names no file, and says so only at INFO level."""
    path = getattr(args, "restore_file", None)
    if isinstance(path, str) and path != "checkpoint_last.pt" and "://" not in path and not os.path.exists(path):
        logging.getLogger("fairseq_ext").warning(f"--restore-file {path}: no such checkpoint file; training starts "
                                                 "from scratch (fairseq's meaning of a missing --restore-file)")


def _fairseq_parser(parse_args_and_arch: Callable) -> Callable:
    @functools.wraps(parse_args_and_arch)
    def wrapper(parser: argparse.ArgumentParser, input_args: Optional[List[str]] = None, *args, **kwargs):
        usage_error = parser.error

        def error(message: str):
            if _names_plugin_option(message):
                parser.exit(2, f"{parser.prog}: error: {message}\n")
            misspelled = _misspelled_plugin_option(message)
            if misspelled:
                parser.exit(2, f"{parser.prog}: error: {misspelled}\n")
            usage_error(message)

        parser.error = error
        argv = list(sys.argv[1:] if input_args is None else input_args)
        refuse_old_spellings(argv, parser)
        if any(flag in argv for flag in HELP_FLAGS):
            # fairseq first parses the known options to find the task, criterion, ...,
            # then adds their options and parses again: keep --help for the second parse
            parse_known_args = parser.parse_known_args

            def first_parse(known_args=None, namespace=None):
                parser.parse_known_args = parse_known_args
                given = argv if known_args is None else known_args
                known, rest = parse_known_args([a for a in given if a not in HELP_FLAGS], namespace)
                if getattr(known, "arch", "") is None:  # no --arch given: no model options to add
                    del known.arch
                return known, rest

            parser.parse_known_args = first_parse
        parsed = parse_args_and_arch(parser, argv, *args, **kwargs)
        options = parsed[0] if isinstance(parsed, tuple) else parsed
        if chooses_plugin_component(options):
            fixes.activate(command_line=True)
        check_parsed(options)
        _warn_missing_restore_file(options)
        return parsed

    wrapper.__fairseq_ext__ = True
    return wrapper


def install() -> None:
    """One-line errors for plugin options and a complete ``--help`` in fairseq's parser
    (idempotent)."""
    from fairseq import options

    if not getattr(options.parse_args_and_arch, "__fairseq_ext__", False):
        options.parse_args_and_arch = _fairseq_parser(options.parse_args_and_arch)
