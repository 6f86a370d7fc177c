"""``--criterion pg``: policy gradient / REINFORCE (MGS paper eq. 5 and 8).

For each input: n candidates by ancestral sampling; loss = mean_k (c_k - b_k) log
p(y^(k) | x) summed over the batch (sample size = sentences), with a baseline b_k
that does not use sample k: the mean cost of the input's other samples
(``loo``, Kool et al. 2019; no state), a lagged moving average of the pooled cost
(``moving``; carried through checkpoints, see ``runtime.checkpoints``),
the cost of the greedy decode of the same input (``greedy``, self-critical), or
none; plus ``--pg-mle-weight`` times the reference's per-token NLL
(``candidate_risk``). Defaults and their sources: docs/mgs.md, "Defaults and why".
"""
from dataclasses import dataclass, field
from typing import Dict

import torch
from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.constraints import at_least
from fairseq_ext.core.risk import MovingAverageBaseline, leave_one_out_baseline, reinforce_loss
from fairseq_ext.criterions.candidate_risk import CandidateRiskCriterion
from fairseq_ext.runtime.distributed import pooled_mean
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig
from fairseq_ext.decoding.steps import DecodingPathConfig
from fairseq_ext.costs.sequence_cost import POST_PROCESS_HELP
from fairseq_ext.core.task_losses import TASK_LOSS_SPEC
from fairseq_ext.costs.batch_scorer import TASK_LOSS_HELP, BatchScorer
from fairseq_ext.runtime.validation import check_options


@dataclass
class PGConfig(DecodingPathConfig):
    pg_samples: int = field(default=4, metadata={"help": "samples per input",
                                                 "parameter": (DecodeConfig, "num_candidates")})
    pg_topk: int = field(default=0, metadata={"help": "top-k for sampling (0: full distribution, unbiased)",
                                              "parameter": (DecodeConfig, "topk")})
    pg_baseline: ChoiceEnum(["loo", "moving", "greedy", "none"]) = field(
        default="loo", metadata={"help": "mean cost of the input's other samples, lagged moving average, "
                                         "self-critical greedy cost, or none"}
    )
    pg_baseline_decay: float = field(default=0.9, metadata={"help": "decay of the moving-average baseline",
                                                            "parameter": (MovingAverageBaseline, "decay")})
    pg_mle_weight: float = field(
        default=0.1, metadata={"help": "weight of the reference's per-token NLL added to each sentence's loss",
                               "constraint": at_least(0)}
    )
    pg_task_loss: str = field(default="sbleu", metadata={"help": TASK_LOSS_HELP.format(what="task loss"),
                                                         "constraint": TASK_LOSS_SPEC})
    pg_max_len_ratio: float = field(default=1.3, metadata={"help": "max length: ratio x longest reference",
                                                           "parameter": (DecodeConfig, "max_len_ref_ratio")})
    pg_post_process: str = field(default="auto", metadata={"help": POST_PROCESS_HELP})


@register_criterion("pg", dataclass=PGConfig)
class PGCriterion(CandidateRiskCriterion):
    LOG_KEYS = ("loss", "cost_mean", "baseline", "nll")

    def __init__(self, task, pg_samples=4, pg_topk=0, pg_baseline="loo", pg_baseline_decay=0.9,
                 pg_mle_weight=0.1, pg_task_loss="sbleu", pg_max_len_ratio=1.3, pg_post_process="auto",
                 decoding_path="static-cache"):
        check_options(PGConfig, locals())
        if str(pg_baseline) == "loo" and pg_samples < 2:
            raise ConfigError(f"--pg-baseline loo needs --pg-samples >= 2 (the other samples), got {pg_samples}")
        scorer = BatchScorer(task, pg_task_loss, post_process=pg_post_process, criterion="pg")
        decode_cfg = DecodeConfig(strategy="sample", num_candidates=pg_samples, topk=pg_topk,
                                  max_len_ref_ratio=pg_max_len_ratio, path=str(decoding_path))
        super().__init__(task, "pg", scorer, decode_cfg, pg_mle_weight)
        self.baseline_kind = str(pg_baseline)
        self.moving = MovingAverageBaseline(pg_baseline_decay)
        self._greedy = []  # the greedy candidates of the batch being decoded

    def checkpoint_state(self) -> Dict[str, float]:
        """Running state a resumed run continues (saved by ``runtime.checkpoints``)."""
        return self.moving.state_dict()

    def load_checkpoint_state(self, state: Dict[str, float]) -> None:
        self.moving.load_state_dict(state)

    def decode(self, module, sample):
        """The samples; with the greedy baseline, its greedy candidates in the same decode (kept
        for ``_baseline``)."""
        if self.baseline_kind != "greedy":
            return super().decode(module, sample)
        decoded = decode_batch(module, sample, self.decode_cfg, with_greedy=True)
        self._greedy = [(decoded.greedy, decoded.batch)]
        return decoded

    def _baseline(self, module, sample, costs) -> torch.Tensor:
        """(B, S) baseline; b_k never uses sample k."""
        bsz = sample["nsentences"]
        if self.baseline_kind == "loo":
            return leave_one_out_baseline(costs)
        if self.baseline_kind == "greedy":
            cand, batch = self._greedy.pop()
            with torch.no_grad():
                greedy, _ = self.scorer.score(cand.as_list(), cand.source_index, batch)
            return greedy.view(bsz, 1).expand_as(costs)
        if self.baseline_kind == "moving":
            # pooled over workers in training, so that every worker holds the same average
            mean = float(pooled_mean(costs.view(-1))) if module.training else float(costs.mean())
            # the first update has no history: it starts from its own pooled mean (as the published
            # code does at every update), not from 0, which would push every sample's probability down
            value = self.moving.value if self.moving.value is not None else mean
            if module.training:
                self.moving.update(mean)
            return torch.full_like(costs, value)
        return torch.zeros_like(costs)

    def estimator(self, module, sample, hyps, log_p, costs):
        baseline = self._baseline(module, sample, costs)
        per_input = reinforce_loss(log_p, costs, baseline)
        return per_input, {"baseline": float(baseline.mean()) * sample["nsentences"]}
