"""``--criterion residual_nce``: conditional NCE (Deng et al., 2020, eq. 3) for a
residual energy model (task ``residual_lm``): every human continuation x_+ is
classified against the m base-LM negatives x_- of its own prefix, with
P(real | x) = sigma(-E(x)).

``--nce-neg-weighting mean`` (default) gives the m negatives together the weight
of the one positive, so the loss is eq. 3 with both expectations estimated by
sample means and its optimum is Theorem 1's E = log P_LM - log P_data whatever m
is; ``sum`` weights each negative like the positive, so m negatives outweigh the
positive m : 1 and the optimum moves by + log m (see core/residual.nce_loss).

Logged (training and validation): ``loss`` (nats per prefix, not bits),
``e_pos`` / ``e_neg`` (mean energy of positives / negatives), ``acc_pos`` /
``acc_neg`` (E_+ < 0, E_- > 0) and ``acc`` their mean (class-balanced accuracy).

It needs task ``residual_lm`` and the negatives of every split it reads: built,
it makes the task refuse, when loading it, a split without them (before training
starts).
"""
import functools
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fairseq_ext.criterions.logged_metrics import summed
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.residual_ebm import NEG_WEIGHTINGS, nce_accuracy, nce_loss
from fairseq_ext.runtime.validation import check_options


@dataclass
class ResidualNCEConfig(FairseqDataclass):
    nce_neg_weighting: ChoiceEnum(NEG_WEIGHTINGS) = field(
        default="mean",
        metadata={"help": "mean: the m negatives weigh as much as the positive (Theorem 1's optimum); "
                          "sum: each negative weighs as much as the positive (optimum shifted by log m)",
                  "parameter": (nce_loss, "neg_weighting")},
    )


@register_criterion("residual_nce", dataclass=ResidualNCEConfig)
class ResidualNCECriterion(FairseqCriterion):
    def __init__(self, task, nce_neg_weighting="mean"):
        super().__init__(task)
        check_options(ResidualNCEConfig, locals())
        if not hasattr(task, "require_negatives"):
            raise ConfigError(f"--criterion residual_nce needs --task residual_lm, got {type(task).__name__}")
        task.require_negatives("--criterion residual_nce")
        self.neg_weighting = nce_neg_weighting

    def forward(self, model, sample, reduce=True):
        pos, neg = sample["positive"], sample["negatives"]  # (B, T), (B, m, T)
        bsz, m, length = neg.shape
        energy = model(torch.cat([pos, neg.reshape(bsz * m, length)], 0))
        e_pos, e_neg = energy[:bsz], energy[bsz:].view(bsz, m)
        losses = nce_loss(e_pos, e_neg, self.neg_weighting)
        loss = losses.sum() if reduce else losses
        pos_ok, neg_ok = nce_accuracy(e_pos, e_neg)
        return loss, bsz, {
            "loss": losses.sum().data, "nsentences": bsz, "ntokens": sample["ntokens"], "sample_size": bsz,
            "e_pos": e_pos.sum().data, "e_neg": e_neg.mean(1).sum().data,
            "acc_pos": pos_ok.sum().data, "acc_neg": neg_ok.float().mean(1).sum().data,
        }

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = functools.partial(summed, logging_outputs)
        n = max(total("sample_size"), 1)
        metrics.log_scalar("loss", total("loss") / n, n, round=4)
        for key in ("e_pos", "e_neg", "acc_pos", "acc_neg"):
            metrics.log_scalar(key, total(key) / n, n, round=4)
        metrics.log_derived("acc", lambda meters: round((meters["acc_pos"].avg + meters["acc_neg"].avg) / 2, 4))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
