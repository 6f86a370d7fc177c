"""fairseq-ext: load with ``--user-dir "$(fairseq-ext-dir)"`` (the installed package's
directory; ``--user-dir fairseq_ext`` from the source tree's root).

Importing the package checks that torch and fairseq are in the supported ranges
(``fairseq_ext.runtime.support``: one line otherwise), registers every criterion, task,
model and task loss with fairseq, and replaces seven fairseq attributes, no more
(docs/fairseq.md lists them; ``tests/test_fairseq_guest.py`` counts them):

* ``fairseq_ext.runtime.checkpoints.install``: checkpoint loading under torch >= 2.6, the
  dictionaries' fingerprints, a criterion's running state, and checkpoint errors that name
  the file and the cause (six attributes);
* ``fairseq_ext.runtime.parser.install``: fairseq's parser reads the plugin's renamed
  options, ends a bad plugin option with one line, completes ``--help``, checks the
  plugin's option rules, and applies ``fairseq_ext.runtime.fixes`` where a command chooses
  one of the plugin's components (one attribute).

A command that chooses only fairseq's own components runs as fairseq runs it.
"""
from fairseq_ext.runtime import support

support.check_or_exit()

from fairseq_ext.runtime import checkpoints, fixes, parser  # noqa: E402

checkpoints.install()
parser.install()
if fixes.mode() == "all":  # FAIRSEQ_EXT_FIXES=all: fairseq's own components get the fixes too
    fixes.activate()

from fairseq_ext.costs import model_costs, sequence_cost  # noqa: E402,F401  (register lm, reverse, paraphrase, fluency)
from fairseq_ext import criterions  # noqa: E402,F401
from fairseq_ext import models  # noqa: E402,F401
from fairseq_ext import tasks  # noqa: E402,F401
