"""``--criterion pg``: policy gradient / REINFORCE (MGS paper eq. 5 and 8).

For each input: n candidates by ancestral sampling; loss = mean_k (c_k - b) log
p(y^(k) | x) summed over the batch (sample size = sentences), with a baseline b
that does not use the current samples: a lagged moving average of the pooled
cost (``moving``; it restarts with every epoch, so that a resumed run continues
it exactly, see ``criterions/clock.py``), the cost of the greedy decode of the same input
(``greedy``, self-critical), or none; plus ``--pg-mle-weight`` times the
reference's sequence NLL.
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fairseq_ext.cli import ConfigError
from fairseq_ext.core.risk import MovingAverageBaseline, reinforce_loss
from fairseq_ext.core.task_losses import pooled_mean
from fairseq_ext.criterions.candidate_risk import CandidateRiskCriterion
from fairseq_ext.criterions.clock import CheckpointedValue, TrainingClock
from fairseq_ext.generators.candidates import DecodeConfig
from fairseq_ext.losses import POST_PROCESS_HELP
from fairseq_ext.sequence_level import BatchScorer


@dataclass
class PGConfig(FairseqDataclass):
    pg_samples: int = field(default=4, metadata={"help": "samples per input"})
    pg_topk: int = field(default=0, metadata={"help": "top-k for sampling (0: full distribution, unbiased)"})
    pg_baseline: ChoiceEnum(["moving", "greedy", "none"]) = field(
        default="moving", metadata={"help": "lagged moving average, self-critical greedy cost, or none"}
    )
    pg_baseline_decay: float = field(default=0.9, metadata={"help": "decay of the moving-average baseline"})
    pg_mle_weight: float = field(default=0.0, metadata={"help": "weight of the reference's sequence NLL"})
    pg_task_loss: str = field(default="sbleu", metadata={"help": "task loss: a registered cost or 'edit=1,rep=0.5'"})
    pg_max_len_ratio: float = field(default=1.3, metadata={"help": "max length: ratio x longest reference"})
    pg_post_process: str = field(default="auto", metadata={"help": POST_PROCESS_HELP})


@register_criterion("pg", dataclass=PGConfig)
class PGCriterion(CandidateRiskCriterion):
    LOG_KEYS = ("loss", "cost_mean", "baseline", "nll")

    def __init__(self, task, pg_samples=4, pg_topk=0, pg_baseline="moving", pg_baseline_decay=0.9,
                 pg_mle_weight=0.0, pg_task_loss="sbleu", pg_max_len_ratio=1.3, pg_post_process="auto"):
        if pg_samples < 1:
            raise ConfigError(f"--pg-samples must be >= 1, got {pg_samples}")
        scorer = BatchScorer(task, pg_task_loss, post_process=pg_post_process, criterion="pg")
        decode_cfg = DecodeConfig(strategy="sample", num_candidates=pg_samples, topk=pg_topk,
                                  max_len_ref_ratio=pg_max_len_ratio)
        super().__init__(task, "pg", scorer, decode_cfg, pg_mle_weight)
        self.baseline_kind = str(pg_baseline)
        self.moving = MovingAverageBaseline(pg_baseline_decay)
        # restarts with every epoch; a resumed run continues it exactly (criterions/clock.py)
        self.moving_state = CheckpointedValue("pg_moving_baseline", TrainingClock(task))
        self.greedy_cfg = DecodeConfig(max_len_ref_ratio=pg_max_len_ratio)

    def _baseline(self, module, sample) -> torch.Tensor:
        """(B, 1) baseline, computed without the current samples."""
        bsz = sample["nsentences"]
        if self.baseline_kind == "greedy":
            cand, batch = self.scorer.decode(module, sample, self.greedy_cfg)
            with torch.no_grad():
                costs, _ = self.scorer.score(cand.as_list(), cand.source_index, batch)
            return costs.view(bsz, 1)
        if self.baseline_kind == "moving":
            self.moving.value = self.moving_state.get()
            return torch.full((bsz, 1), self.moving.get())
        return torch.zeros(bsz, 1)

    def estimator(self, module, sample, hyps, log_p, costs):
        baseline = self._baseline(module, sample)
        per_input = reinforce_loss(log_p, costs, baseline)
        if module.training and self.baseline_kind == "moving":
            self.moving.update(float(pooled_mean(costs.view(-1))))
            self.moving_state.set(self.moving.value)
        return per_input, {"baseline": float(baseline.mean()) * sample["nsentences"]}
