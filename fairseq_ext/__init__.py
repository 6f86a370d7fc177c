"""fairseq-ext: load with ``--user-dir "$(fairseq-ext-dir)"`` (the installed package's
directory; ``--user-dir fairseq_ext`` from the source tree's root).

Importing the package checks that torch and fairseq are in the supported ranges
(``fairseq_ext.runtime.support``: one line otherwise), registers every criterion, task, model and task loss with
fairseq, makes fairseq's checkpoint loader work under torch >= 2.6, its copies
to ``checkpoint_last.pt`` atomic, its start-up check of ``--save-dir`` safe for
concurrent runs, carries criterion state through checkpoints, fixes ``--amp``'s loss
scaling (one unscale; ``--amp-init-scale`` / ``--amp-scale-window`` honoured),
names a missing data directory or split and a checkpoint that does not load in one
line, refuses a checkpoint trained with other dictionaries (``fairseq_ext.runtime.dictionaries``), and lets fairseq's batch threads finish before the process exits (see
``fairseq_ext.runtime.checkpoints``), and makes a bad plugin option end a command with one line
(``fairseq_ext.runtime.validation``) and ``--help`` list the chosen components' options
(see ``fairseq_ext.runtime.cli``).
"""
from fairseq_ext.runtime import support

support.check_or_exit()

from fairseq_ext.runtime import cli, dictionaries, parser  # noqa: E402
from fairseq_ext.runtime.checkpoints import (  # noqa: E402
    patch_amp_loss_scaler,
    patch_checkpoint_copies,
    patch_checkpoint_errors,
    patch_checkpoint_loading,
    patch_criterion_configuration,
    patch_criterion_state,
    patch_input_errors,
    patch_resume_batches,
    stop_batch_threads_at_exit,
)

patch_checkpoint_loading()
patch_checkpoint_copies()
patch_criterion_state()
patch_criterion_configuration()
patch_resume_batches()
patch_amp_loss_scaler()
patch_input_errors()
patch_checkpoint_errors()
dictionaries.patch_dictionary_check()
stop_batch_threads_at_exit()
cli.install()
parser.install()

from fairseq_ext.costs import sequence_cost  # noqa: E402,F401  (registers the ``lm`` task loss)
from fairseq_ext import criterions  # noqa: E402,F401
from fairseq_ext import models  # noqa: E402,F401
from fairseq_ext import tasks  # noqa: E402,F401
