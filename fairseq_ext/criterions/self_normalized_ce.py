"""``--criterion self_normalized_ce``: cross-entropy plus lambda sum_t (log Z_t)^2
(Goyal thesis section 5.3.1), which pushes every step's local log-normaliser
log Z_t = logsumexp(s_t) towards 0, so that the raw scores s_t are (nearly)
log-probabilities and a globally normalised model (``--soft-beam-normalization global`` of
the soft beam criteria) can start from this model (section 5.3, Tables 5.1, 5.4).

Logged: ``loss`` (with the penalty), ``nll_loss`` (the CE), ``ppl``, and the mean
and variance of log Z over target tokens (``log_z_mean``, ``log_z_var``: the
columns of Table 5.1), in training and validation.
"""
import functools
from dataclasses import dataclass, field

from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from fairseq_ext.criterions.logged_metrics import log_cross_entropy, summed
from fairseq_ext.core.token_losses import self_normalized_nll
from fairseq_ext.runtime.validation import check_options


@dataclass
class SelfNormalizedCEConfig(FairseqDataclass):
    self_norm_lambda: float = field(default=0.1, metadata={"help": "lambda, weight of sum_t (log Z_t)^2",
                                                           "parameter": (self_normalized_nll, "lam")})
    sentence_avg: bool = II("optimization.sentence_avg")


@register_criterion("self_normalized_ce", dataclass=SelfNormalizedCEConfig)
class SelfNormalizedCECriterion(FairseqCriterion):
    def __init__(self, task, self_norm_lambda=0.1, sentence_avg=False):
        super().__init__(task)
        check_options(SelfNormalizedCEConfig, locals())
        self.lam = self_norm_lambda
        self.sentence_avg = sentence_avg

    def forward(self, model, sample, reduce=True):
        logits = model(**sample["net_input"])[0]
        target = model.get_targets(sample, (logits, None))
        loss, nll, log_z = self_normalized_nll(logits.view(-1, logits.size(-1)), target.view(-1), self.lam,
                                               self.padding_idx)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        return loss, sample_size, {
            "loss": loss.data, "nll_loss": nll.data, "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0), "sample_size": sample_size,
            "log_z_sum": log_z.sum().data, "log_z_sq_sum": (log_z ** 2).sum().data,
        }

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = functools.partial(summed, logging_outputs)
        _, ntokens = log_cross_entropy(logging_outputs)
        # exact over the whole epoch: sums, then derived statistics
        metrics.log_scalar_sum("_log_z_n", ntokens)
        metrics.log_scalar_sum("_log_z_sum", total("log_z_sum"))
        metrics.log_scalar_sum("_log_z_sq_sum", total("log_z_sq_sum"))

        def mean(m):
            return m["_log_z_sum"].sum / max(m["_log_z_n"].sum, 1)

        metrics.log_derived("log_z_mean", lambda m: round(mean(m), 4))
        metrics.log_derived("log_z_var", lambda m: round(max(m["_log_z_sq_sum"].sum / max(m["_log_z_n"].sum, 1)
                                                             - mean(m) ** 2, 0.0), 4))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
