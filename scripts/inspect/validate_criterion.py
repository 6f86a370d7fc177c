#!/usr/bin/env python
"""fairseq-validate with a criterion given on the command line instead of the checkpoint's.

usage: validate_criterion.py "{'_name': 'mgs', 'mgs_task_loss': 'lm', ...}" FAIRSEQ-VALIDATE-ARGS...

fairseq-validate always builds the criterion saved in the checkpoint, and
``--model-overrides`` can only change fields that criterion already has, so an
MLE checkpoint cannot be scored with, e.g., the MGS criterion's greedy task loss.
Unset fields take the criterion's defaults.
"""
import ast
import sys

from fairseq import checkpoint_utils
from fairseq_cli import validate
from omegaconf import OmegaConf, open_dict


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    criterion = ast.literal_eval(sys.argv.pop(1))
    if not isinstance(criterion, dict) or "_name" not in criterion:
        sys.exit("validate_criterion.py: the first argument must be a dict with a '_name' key")
    load = checkpoint_utils.load_model_ensemble_and_task

    def load_with_criterion(*args, **kwargs):
        models, cfg, task = load(*args, **kwargs)
        with open_dict(cfg):
            cfg.criterion = OmegaConf.create(criterion)
        return models, cfg, task

    checkpoint_utils.load_model_ensemble_and_task = load_with_criterion
    validate.cli_main()


if __name__ == "__main__":
    main()
