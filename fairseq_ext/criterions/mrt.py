"""``--criterion mrt``: minimum risk training (MGS paper eq. 6-7; Shen et al. 2016).

For each input: S candidates (ancestral sampling or beam search), a repeated
candidate counted once (the set S of eq. 6), optionally plus the reference when no
candidate equals it; q = p^alpha renormalised over the set, loss = the expected
task loss under q (its gradient divided by alpha: eq. 7 without the factor alpha,
so alpha only shapes q), summed over the batch (sample size = sentences), plus
``--mrt-mle-weight`` times the reference's per-token NLL (``candidate_risk``).
Defaults and their sources: docs/mgs.md, "Defaults and why".
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum

from fairseq_ext.core.constraints import above, at_least
from fairseq_ext.core.risk import distinct_mask, mrt_distribution, mrt_risk, normalize_costs, scale_gradient
from fairseq_ext.criterions.candidate_risk import CandidateRiskCriterion
from fairseq_ext.decoding.candidates import STRATEGIES, DecodeConfig
from fairseq_ext.scoring.teacher_forced import pad_columns
from fairseq_ext.decoding.steps import DecodingPathConfig
from fairseq_ext.costs.sequence_cost import POST_PROCESS_HELP
from fairseq_ext.core.task_losses import TASK_LOSS_SPEC
from fairseq_ext.costs.batch_scorer import TASK_LOSS_HELP, BatchScorer
from fairseq_ext.runtime.validation import check_options


@dataclass
class MRTConfig(DecodingPathConfig):
    mrt_candidates: int = field(default=8, metadata={"help": "S, candidates drawn per input (repeats count once)",
                                                     "parameter": (DecodeConfig, "num_candidates")})
    mrt_decoder: ChoiceEnum([s for s in STRATEGIES if s != "greedy"]) = field(
        default="sample", metadata={"help": "how candidates are drawn", "parameter": (DecodeConfig, "strategy")})
    mrt_topk: int = field(default=0, metadata={"help": "top-k for sampling (0: full distribution)",
                                               "parameter": (DecodeConfig, "topk")})
    mrt_alpha: float = field(
        default=0.005, metadata={"help": "sharpness alpha of q = p^alpha / Z on summed log-probabilities (eq. 6); "
                                         "Shen et al. (2016) use 0.005", "constraint": above(0)}
    )
    mrt_include_reference: bool = field(
        default=False, metadata={"help": "add the reference to the candidate set when no candidate equals it"}
    )
    mrt_length_normalize: bool = field(
        default=False,
        metadata={"help": "use the mean token log-probability in q (the sequence-level normalisation of "
                          "fairseq's old sequence_risk criterion) instead of log p(y|x)"},
    )
    mrt_normalize_costs: bool = field(default=False, metadata={"help": "min-max normalise costs per input"})
    mrt_mle_weight: float = field(
        default=0.1, metadata={"help": "weight of the reference's per-token NLL added to each sentence's risk",
                               "constraint": at_least(0)}
    )
    mrt_task_loss: str = field(default="sbleu", metadata={"help": TASK_LOSS_HELP.format(what="task loss"),
                                                          "constraint": TASK_LOSS_SPEC})
    mrt_max_len_ratio: float = field(default=1.3, metadata={"help": "max length: ratio x longest reference",
                                                            "parameter": (DecodeConfig, "max_len_ref_ratio")})
    mrt_post_process: str = field(default="auto", metadata={"help": POST_PROCESS_HELP})


@register_criterion("mrt", dataclass=MRTConfig)
class MRTCriterion(CandidateRiskCriterion):
    LOG_KEYS = ("loss", "risk", "cost_mean", "nll", "distinct", "q_max")

    def __init__(self, task, mrt_candidates=8, mrt_decoder="sample", mrt_topk=0, mrt_alpha=0.005,
                 mrt_include_reference=False, mrt_length_normalize=False, mrt_normalize_costs=False,
                 mrt_mle_weight=0.1, mrt_task_loss="sbleu", mrt_max_len_ratio=1.3, mrt_post_process="auto",
                 decoding_path="static-cache"):
        check_options(MRTConfig, locals())
        scorer = BatchScorer(task, mrt_task_loss, post_process=mrt_post_process, criterion="mrt")
        decode_cfg = DecodeConfig(strategy=str(mrt_decoder), num_candidates=mrt_candidates, topk=mrt_topk,
                                  max_len_ref_ratio=mrt_max_len_ratio, path=str(decoding_path))
        super().__init__(task, "mrt", scorer, decode_cfg, mrt_mle_weight)
        self.alpha = mrt_alpha
        self.include_reference = mrt_include_reference
        self.length_normalize = mrt_length_normalize
        self.normalize = mrt_normalize_costs

    def candidate_set(self, module, cand, batch):
        """The candidates of each input, then its reference (a repeat of a candidate
        when one equals it: ``distinct_mask`` leaves it out of the set)."""
        hyps, index, tokens = cand.as_list(), cand.source_index, cand.tokens
        if not self.include_reference:
            return hyps, index, tokens
        refs, target = self.scorer.references(batch), batch["target"]
        s, pad = cand.num_per_input, self.padding_idx
        hyps = [h for i in range(len(refs)) for h in hyps[i * s:(i + 1) * s] + [refs[i]]]
        width = max(tokens.size(1), target.size(1))
        tokens = torch.cat([pad_columns(tokens, width, pad).view(len(refs), s, width),
                            pad_columns(target, width, pad)[:, None]], dim=1).view(-1, width)
        return hyps, torch.arange(len(refs)).repeat_interleave(s + 1), tokens

    def estimator(self, module, sample, hyps, log_p, costs):
        mask = distinct_mask(hyps, log_p.size(1)).to(log_p.device)
        if self.length_normalize:
            lengths = torch.tensor([max(len(h), 1) for h in hyps], dtype=log_p.dtype,
                                   device=log_p.device).view_as(log_p)
            log_p = log_p / lengths
        if self.normalize:
            costs = normalize_costs(costs)  # a repeat has its first occurrence's cost: same min and max
        risk = mrt_risk(log_p, costs, self.alpha, mask)
        with torch.no_grad():
            q_max = mrt_distribution(log_p, self.alpha, mask).max(dim=1).values
        logged = {"risk": float(risk.detach().sum()), "distinct": float(mask.sum()), "q_max": float(q_max.sum())}
        # the value is the risk; the gradient eq. 7 / alpha (alpha shapes q, the MLE weight stays meaningful)
        return scale_gradient(risk, 1.0 / self.alpha), logged
