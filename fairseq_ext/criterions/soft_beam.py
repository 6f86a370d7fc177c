"""``--criterion soft_beam_direct_loss`` and ``--criterion soft_beam_hinge``:
training through a continuous relaxation of beam search (Goyal thesis, chapter 4;
chapter 5 for ``--soft-beam-normalization global``).

Each step runs the relaxed beam (``fairseq_ext.decoding.beam_search.run_beam``,
Algorithm 3) over every sentence with a decomposable Hamming cost:

- tagging (a task with ``forced_output_length``): for the gold length, d_t(w) =
  c(w) [w != y*_t];
- otherwise (translation) under the decoder's rules: an open length ended by EOS
  (no special symbol but EOS proposed, no EOS first), EOS forced after
  ``--soft-beam-extra-len`` tokens past the reference length, and the Hamming
  cost over max(hypothesis, reference) positions, a missing position counting as
  an error (``core.beam_relaxation.open_length_hamming_costs``).

- ``soft_beam_direct_loss`` minimises L = peaked-softmax_alpha(s_T) . D_T, the
  relaxed cost of the beam's best element (eq. 4.2);
- ``soft_beam_hinge`` adds d_t(w) to the candidate scores (cost augmentation),
  and minimises max(0, s_max - s(y*)) with s_max = peaked-softmax_alpha(s_T) . s_T
  and s(y*) the teacher-forced score of the gold sequence under the same scoring
  (section 4.4).

Scores are log-softmax outputs (``--soft-beam-normalization local``) or raw logits
(``global``: a globally normalised model, chapter 5). alpha follows
``--soft-beam-alpha-schedule`` over updates (annealing matters, section 4.3.3).
The loss is summed over sentences; the sample size is the number of sentences.
``--soft-beam-dropout`` chooses the dropout of the search pass (``none``: eval
mode; ``shared``: one mask per sentence for its beam rows; ``independent``); the
hinge's gold pass keeps the model's dropout. The criterion keeps its
``--soft-beam-normalization`` in the checkpoint (task state) as the decoding default.
Logged: ``loss``, ``beam_cost`` (the Hamming cost of the soft beam's decoded
best hypothesis, hard backpointers: section 4.3.4), ``soft_beam_alpha``.
"""
import functools
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum

from fairseq_ext.criterions.logged_metrics import summed
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.constraints import above, at_least
from fairseq_ext.core.schedules import ALPHA_SCHEDULES, interpolated
from fairseq_ext.core.beam_relaxation import (
    hamming_step_costs,
    open_length_hamming_costs,
    soft_beam_loss,
    soft_max_score,
)
from fairseq_ext.core.beam_relaxation import parse_label_weights
from fairseq_ext.runtime.clock import TrainingClock, check_model_at_start
from fairseq_ext.runtime.distributed import forward_in_wrapper
from fairseq_ext.decoding.beam_search import (
    DROPOUT_MODES,
    NORMALIZATIONS,
    local_scores,
    run_beam,
)
from fairseq_ext.decoding.soft_inputs import check_step_decodable
from fairseq_ext.decoding.steps import DecodingPathConfig
from fairseq_ext.generators.beam_generator import remember_normalization
from fairseq_ext.runtime.validation import as_options, check_options


@dataclass
class SoftBeamConfig(DecodingPathConfig):
    soft_beam_size: int = field(default=3, metadata={"help": "k, the beam size of the relaxed beam (thesis: 3)",
                                                     "constraint": at_least(1)})
    soft_beam_alpha: float = field(default=1.0, metadata={"help": "alpha_0 of the peaked softmax", "constraint": above(0),
                                                          "parameter": (interpolated, "value0")})
    soft_beam_alpha_schedule: ChoiceEnum(ALPHA_SCHEDULES) = field(
        default="exponential", metadata={"help": "alpha fixed, or growing linearly / geometrically to "
                                                 "--soft-beam-alpha-final (the default: geometrically to 100, the "
                                                 "recommended setting, docs/soft_beam.md; the thesis fixes alpha)",
                                   "parameter": (interpolated, "schedule")}
    )
    soft_beam_alpha_final: float = field(default=100.0, metadata={"help": "alpha_1, reached after --soft-beam-alpha-updates",
                                                                "parameter": (interpolated, "value1")})
    soft_beam_alpha_updates: int = field(default=1000, metadata={"help": "N, updates to go from alpha_0 to alpha_1",
                                                                 "parameter": (interpolated, "horizon")})
    soft_beam_normalization: ChoiceEnum(NORMALIZATIONS) = field(
        default="local", metadata={"help": "local: log-softmax scores; global: raw logits (globally normalised)",
                                   "deprecated": "--normalization"}
    )
    soft_beam_hamming_weights: str = field(
        default="",
        metadata={"help": "cost of predicting a label wrongly, e.g. 'O=2.0' (the thesis's NER setting); default 1",
                  "deprecated": "--hamming-weights"},
    )
    soft_beam_extra_len: int = field(
        default=2, metadata={"help": "translation: the search may run this many tokens past the reference length, "
                                     "then EOS is forced (tagging searches the gold length)",
                    "constraint": at_least(0)})
    soft_beam_dropout: ChoiceEnum(DROPOUT_MODES) = field(
        default="none", metadata={"help": "dropout of the search pass: none (eval mode), shared (one mask per sentence "
                                          "for its beam rows) or independent (every beam row its own)"})
    soft_beam_compile: ChoiceEnum(["off", "on"]) = field(
        default="off", metadata={"help": "on: the search's decoder step and relaxed top-k step compiled by "
                                         "torch.compile (fewer, fused kernels; minutes of compiling first); off: eager"})


class _SoftBeamCriterion(FairseqCriterion):
    hinge = False

    def __init__(self, task, soft_beam_size=3, soft_beam_alpha=1.0, soft_beam_alpha_schedule="exponential",
                 soft_beam_alpha_final=100.0, soft_beam_alpha_updates=1000, soft_beam_normalization="local",
                 soft_beam_hamming_weights="",
                 soft_beam_extra_len=2, soft_beam_dropout="none", soft_beam_compile="off",
                 decoding_path="static-cache"):
        super().__init__(task)
        check_options(SoftBeamConfig, locals())
        self.path = str(decoding_path)
        self.k = soft_beam_size
        self.schedule = str(soft_beam_alpha_schedule)
        self.alpha0, self.alpha1, self.alpha_updates = soft_beam_alpha, soft_beam_alpha_final, soft_beam_alpha_updates
        with as_options(SoftBeamConfig):
            interpolated(self.schedule, self.alpha0, self.alpha1, 0, self.alpha_updates)
        self.normalization = str(soft_beam_normalization)
        remember_normalization(task, self.normalization)
        self.extra_len, self.dropout = soft_beam_extra_len, str(soft_beam_dropout)
        self.compiled = str(soft_beam_compile) == "on"
        self.open_length = not getattr(task, "forced_output_length", False)
        self.eos = task.target_dictionary.eos()
        dictionary = task.target_dictionary
        try:
            weights = parse_label_weights(soft_beam_hamming_weights)
        except ValueError as e:
            raise ConfigError(f"--soft-beam-hamming-weights: {e}") from None
        unknown = sorted(label for label in weights if dictionary.index(label) == dictionary.unk())
        if unknown:
            raise ConfigError(f"--soft-beam-hamming-weights: labels not in the target dictionary: {unknown}")
        self.label_costs = torch.ones(len(dictionary))
        for label, w in weights.items():
            self.label_costs[dictionary.index(label)] = w
        self.clock = TrainingClock(task)
        who = "--criterion soft_beam_" + ("hinge" if self.hinge else "direct_loss")
        check_model_at_start(task, lambda model: check_step_decodable(model, who))

    def alpha(self) -> float:
        return interpolated(self.schedule, self.alpha0, self.alpha1, self.clock.num_updates, self.alpha_updates)

    def forward(self, model, sample, reduce=True):
        return forward_in_wrapper(model, self._forward, sample)

    def _forward(self, model, sample):
        target = sample["target"]
        horizon = target.ne(self.padding_idx).sum(1)
        V = self.label_costs.numel()
        if self.open_length:
            horizon = (horizon + self.extra_len).clamp(max=model.max_decoder_positions())
            costs = open_length_hamming_costs(target, int(horizon.max()), V, self.eos, self.padding_idx,
                                              self.label_costs)
        else:
            costs = hamming_step_costs(target, V, self.label_costs, self.padding_idx)
        alpha = self.alpha()
        result = run_beam(model, sample["net_input"], horizon, self.k, alpha, self.normalization, costs,
                          augment=self.hinge, stop_at_eos=self.open_length, dropout=self.dropout, path=self.path,
                          compiled=self.compiled)
        if self.hinge:
            gold = self.gold_scores(model, sample)
            losses = torch.relu(soft_max_score(result.scores, alpha) - gold)
        else:
            losses = soft_beam_loss(result.scores, result.costs, alpha)
        if not torch.isfinite(losses).all():
            raise FloatingPointError(f"{type(self).__name__}: non-finite loss for {int((~torch.isfinite(losses)).sum())} "
                                     "sentence(s); check --soft-beam-normalization and the model's scores")
        best = result.best_tokens()  # pad past its end, where the costs are 0
        beam_cost = costs[:, : best.size(1)].gather(-1, best.unsqueeze(-1)).sum()
        nsentences = target.size(0)
        logging_output = {
            "loss": losses.sum().data,
            "beam_cost": beam_cost.data,
            "ntokens": sample["ntokens"],
            "nsentences": nsentences,
            "sample_size": nsentences,
            "soft_beam_alpha": alpha,
            "steps": 1,
        }
        return losses.sum(), nsentences, logging_output

    def gold_scores(self, model, sample) -> torch.Tensor:
        """(B,) s(y*): the teacher-forced score of the gold sequence, sum_t f(h_t, y*_t)."""
        logits = model(**sample["net_input"])[0]
        f = local_scores(logits, self.normalization)
        target = sample["target"]
        gold = f.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return gold.masked_fill(target.eq(self.padding_idx), 0.0).sum(-1)

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = functools.partial(summed, logging_outputs)
        nsent = max(total("nsentences"), 1)
        metrics.log_scalar("loss", total("loss") / nsent, nsent, round=4)
        metrics.log_scalar("beam_cost", total("beam_cost") / nsent, nsent, round=4)
        steps = total("steps")
        if steps:
            metrics.log_scalar("soft_beam_alpha", total("soft_beam_alpha") / steps, steps, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


@register_criterion("soft_beam_direct_loss", dataclass=SoftBeamConfig)
class SoftBeamDirectLossCriterion(_SoftBeamCriterion):
    """L = peaked-softmax_alpha(s_T) . D_T (eq. 4.2); see the module docstring."""

    hinge = False


@register_criterion("soft_beam_hinge", dataclass=SoftBeamConfig)
class SoftBeamHingeCriterion(_SoftBeamCriterion):
    """max(0, s_max - s(y*)) with cost-augmented scores (section 4.4)."""

    hinge = True

