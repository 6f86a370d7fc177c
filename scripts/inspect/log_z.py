#!/usr/bin/env python
"""Mean and variance of the per-step log normaliser log Z_t = logsumexp(logits_t) of a
checkpoint on one or more splits (Goyal thesis Table 5.1).

Takes fairseq-validate's options (``--path``, ``--valid-subset train,valid``, the task
options) and prints its usual ``valid on 'SPLIT' subset`` lines, computed by the
``self_normalized_ce`` criterion whatever criterion the checkpoint was trained with
(fairseq-validate itself always uses the checkpoint's own criterion, and
``--model-overrides`` does not replace it). Look for ``log_z_mean`` / ``log_z_var``
(exact over the split); ``loss`` includes lambda (log Z)^2, lambda = 0.1."""
import fairseq.tasks
from fairseq_cli import validate


def _self_normalized_ce(task, cfg, from_checkpoint=False):
    from fairseq_ext.criterions.self_normalized_ce import SelfNormalizedCECriterion
    return SelfNormalizedCECriterion(task, self_norm_lambda=0.1)


if __name__ == "__main__":
    fairseq.tasks.FairseqTask.build_criterion = _self_normalized_ce
    validate.cli_main()
