"""How the plugin talks to a person at the command line.

``ConfigError`` is the one exception for a bad option value or input file: its
message names the option (or file) and what is allowed. When one escapes a
command that chooses one of the plugin's components (``fairseq-train --criterion mrt``,
``fairseq-generate --task translation_mbr``) or one of the plugin's own commands
(``python -m fairseq_ext.finetune``, ...), the command ends with that one line and exit
status 2, as argparse does for a bad option:

    fairseq-train: error: --mgs-alpha must be > 0, got 0.0

``install`` sets that ``sys.excepthook``; importing the package does not (``runtime.fixes``
calls it where such a command parses its options). ``FAIRSEQ_EXT_TRACEBACK=1`` prints the
full traceback instead. Any other exception keeps Python's traceback.

fairseq's parser (``fairseq.options.parse_args_and_arch``) gets six changes
(``runtime.parser``):

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
  value ends the command before fairseq creates ``--save-dir`` or reads data;
* a ``--restore-file`` that does not exist is named in a warning line (fairseq then trains
  from scratch, as it does without the plugin);
* a command that chooses a plugin component gets ``runtime.fixes`` and this module's
  one-line errors.
"""
import os
import sys
from typing import Callable

TRACEBACK_ENV = "FAIRSEQ_EXT_TRACEBACK"


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


def install() -> None:
    """One-line ConfigErrors (``sys.excepthook``; idempotent)."""
    if not getattr(sys.excepthook, "__fairseq_ext__", False):
        sys.excepthook = _one_line_config_errors(sys.excepthook)
