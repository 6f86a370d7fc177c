"""How the plugin talks to a person at the command line (installed on import).

``ConfigError`` is the one exception for a bad option value or input file: its
message names the option (or file) and what is allowed. When one escapes a
console command (``fairseq-train``, ``fairseq-generate``, a script), the command
ends with that one line and exit status 2, as argparse does for a bad option:

    fairseq-train: error: --mgs-alpha must be > 0, got 0.0

``FAIRSEQ_EXT_TRACEBACK=1`` prints the full traceback instead. Any other
exception keeps Python's traceback.

fairseq's parser (``fairseq.options.parse_args_and_arch``) gets four changes:

* the old spelling of a renamed plugin option is read as its new name, with a
  warning line (``runtime.renamed``);
* an argparse error about one of the plugin's options (a choice or type error,
  e.g. ``--mgs-decoder beamsearch``) is that one line too, without fairseq's
  ~180 lines of usage before it;
* ``--help`` also lists the options of the chosen ``--task``, ``--criterion``,
  ``--arch``, ``--optimizer``, ... : fairseq prints help before it adds them,
  so ``fairseq-train --user-dir "$(fairseq-ext-dir)" --criterion mgs --help`` showed no
  ``--mgs-*`` option. Every plugin option is also listed, without choosing, by
  ``python -m fairseq_ext.options`` (``fairseq_ext.options``);
* the parsed options of the chosen plugin components are checked against the
  rules their config dataclasses declare (``runtime.validation``), so a bad
  value ends the command before fairseq creates ``--save-dir`` or reads data.
"""
import argparse
import functools
import os
import re
import sys
from typing import Callable, List, Optional

TRACEBACK_ENV = "FAIRSEQ_EXT_TRACEBACK"
HELP_FLAGS = ("-h", "--help")


class ConfigError(ValueError):
    """A bad option value or input file, found before any work. The message names
    the option (``--mgs-alpha``) or file and the allowed values."""


def _one_line_config_errors(previous: Callable) -> Callable:
    def hook(exc_type, exc, tb):
        if issubclass(exc_type, ConfigError) and not os.environ.get(TRACEBACK_ENV):
            sys.stdout.flush()
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            sys.stderr.write(f"{prog}: error: {exc}\n")
            raise SystemExit(2)  # raised in sys.excepthook, it sets the exit status
        previous(exc_type, exc, tb)

    hook.__fairseq_ext__ = True
    return hook


def _names_plugin_option(message: str) -> bool:
    """Whether an argparse error message is about an option a plugin component adds
    (``argument --mgs-decoder: invalid choice: ...``)."""
    from fairseq_ext.options import plugin_flags

    m = re.match(r"argument (\S+): ", message)
    return bool(m) and any(flag in plugin_flags() for flag in m.group(1).split("/"))


def _fairseq_parser(parse_args_and_arch: Callable) -> Callable:
    @functools.wraps(parse_args_and_arch)
    def wrapper(parser: argparse.ArgumentParser, input_args: Optional[List[str]] = None, *args, **kwargs):
        usage_error = parser.error

        def error(message: str):
            if _names_plugin_option(message):
                parser.exit(2, f"{parser.prog}: error: {message}\n")
            usage_error(message)

        parser.error = error
        from fairseq_ext.runtime.renamed import rewrite_argv

        argv = rewrite_argv(sys.argv[1:] if input_args is None else input_args, parser)
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
        from fairseq_ext.runtime.validation import check_parsed

        check_parsed(parsed[0] if isinstance(parsed, tuple) else parsed)
        return parsed

    wrapper.__fairseq_ext__ = True
    return wrapper


def install() -> None:
    """One-line ConfigErrors (``sys.excepthook``), and one-line errors for plugin
    options and a complete ``--help`` in fairseq's parser (idempotent)."""
    from fairseq import options

    if not getattr(sys.excepthook, "__fairseq_ext__", False):
        sys.excepthook = _one_line_config_errors(sys.excepthook)
    if not getattr(options.parse_args_and_arch, "__fairseq_ext__", False):
        options.parse_args_and_arch = _fairseq_parser(options.parse_args_and_arch)
