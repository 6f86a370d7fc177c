"""``--criterion differentiable_scheduled_sampling``: (differentiable) scheduled
sampling (Goyal thesis, section 3.3; Bengio et al. 2015 for the hard modes).

Each training step flips a coin per target position: with probability eps the
decoder is fed the gold previous token (teacher forcing), otherwise the decision
taken on its own scores of the previous step, in one of four modes
(``fairseq_ext.core.relaxations``): the alpha-soft argmax e-bar (section 3.3.2),
the soft Gumbel sample e-tilde, or the discrete argmax / sample of plain
scheduled sampling, the baseline. The loss is the cross-entropy of the gold
token at every position (eq. 3.2 with the mixed history). The target is decoded
left to right through the decoder's incremental state, and nothing is detached,
so the gradient reaches earlier steps through every soft decision: the credit
assignment the relaxation exists for. ``--dss-passes P`` replaces the T
incremental steps by P parallel passes (an approximation).

eps and alpha follow schedules of the epoch or update (``--dss-schedule-unit``)
that are pure functions of fairseq's own counters, so they survive a resume.
When eps = 1 (the warm-up) or no position of a batch is model-fed, the step is
an ordinary teacher-forced forward (the tests check that the sequential pass with
eps = 1 gives the same loss). Validation is teacher-forced cross-entropy.
"""
import functools
import logging
from dataclasses import dataclass, field

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum
from omegaconf import II

from fairseq_ext.criterions.logged_metrics import log_cross_entropy, summed
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.relaxations import DECISION_MODES
from fairseq_ext.core.schedules import EPS_SCHEDULES, check_eps_schedule, exponential_growth, teacher_forcing_prob
from fairseq_ext.core.constraints import at_least
from fairseq_ext.core.token_losses import label_smoothed_nll
from fairseq_ext.runtime.clock import UNITS, TrainingClock, check_model_at_start
from fairseq_ext.runtime.distributed import forward_in_wrapper
from fairseq_ext.decoding.soft_inputs import check_step_decodable
from fairseq_ext.decoding.dss_passes import make_noise_fn, run_scheduled_sampling
from fairseq_ext.decoding.steps import DecodingPathConfig
from fairseq_ext.runtime.validation import as_options, check_options

logger = logging.getLogger(__name__)


@dataclass
class DSSConfig(DecodingPathConfig):
    dss_mode: ChoiceEnum(DECISION_MODES) = field(
        default="soft-sample",
        metadata={"help": "what a model-fed position receives: soft-argmax / soft-sample (the relaxations) or "
                          "hard-argmax / hard-sample (plain scheduled sampling, the baseline); the default is the "
                          "measured best (docs/dss.md), the thesis's chapter 3 uses soft-argmax"},
    )
    dss_schedule: ChoiceEnum(EPS_SCHEDULES) = field(
        default="inverse_sigmoid",
        metadata={"help": "decay of eps, the gold-token probability, after the warm-up: k/(k+exp(t/k)), "
                          "k^t, 1-slope*t, or 0 (always feed the model's decisions)",
                  "parameter": (check_eps_schedule, "schedule")},
    )
    dss_schedule_unit: ChoiceEnum(UNITS) = field(
        default="epoch", metadata={"help": "t counts epochs completed or updates done"}
    )
    dss_warmup: float = field(
        default=1.0, metadata={"help": "teacher forcing (eps = 1) for this many schedule units first (epochs with "
                                       "the default unit: the thesis's warm-up from scratch; on a corpus whose epoch "
                                       "is longer than the run, the whole run); the decay's t counts from it",
                               "constraint": at_least(0)}
    )
    dss_warmup_updates: int = field(
        default=0, metadata={"help": "teacher forcing (eps = 1) for the first N updates as well, counted in updates "
                                     "whatever --dss-schedule-unit is (from a trained model: 0 with --dss-warmup 0)",
                             "constraint": at_least(0)}
    )
    dss_decay_k: float = field(
        default=100.0, metadata={"help": "k: inverse sigmoid strength (>= 1, larger = gentler; the default is the "
                                         "measured best, the thesis's chapter 3 uses 10) or exponential base",
                                "parameter": (check_eps_schedule, "k")}
    )
    dss_decay_slope: float = field(default=0.1, metadata={"help": "slope of the linear schedule",
                                                          "parameter": (check_eps_schedule, "slope")})
    dss_min_eps: float = field(default=0.0, metadata={"help": "floor of eps",
                                                      "parameter": (check_eps_schedule, "min_eps")})
    dss_alpha: float = field(default=1.0, metadata={"help": "alpha of the peaked softmax (soft modes)",
                                                    "parameter": (exponential_growth, "value0")})
    dss_alpha_growth: float = field(
        default=1.0, metadata={"help": "alpha is multiplied by this per schedule unit after the warm-up (1 = fixed)",
                               "parameter": (exponential_growth, "growth")}
    )
    dss_alpha_max: float = field(default=1e4, metadata={"help": "cap of the annealed alpha"})
    dss_passes: int = field(
        default=0,
        metadata={"help": "0: exact left-to-right decoding; P >= 2: P parallel passes, each fed the previous "
                          "pass's decisions (approximation, faster for transformers)",
                  "parameter": (run_scheduled_sampling, "passes")},
    )
    dss_compile: ChoiceEnum(["off", "on"]) = field(
        default="off",
        metadata={"help": "on: the exact pass's decoder step compiled by torch.compile (fewer, fused kernels; "
                          "minutes of compiling first; dropout masks from the compiler's generator); off: eager"},
    )
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing epsilon",
                                                          "parameter": (label_smoothed_nll, "epsilon")})
    sentence_avg: bool = II("optimization.sentence_avg")


@register_criterion("differentiable_scheduled_sampling", dataclass=DSSConfig)
class DSSCriterion(FairseqCriterion):
    def __init__(self, task, dss_mode="soft-sample", dss_schedule="inverse_sigmoid", dss_schedule_unit="epoch",
                 dss_warmup=1.0, dss_warmup_updates=0, dss_decay_k=100.0, dss_decay_slope=0.1, dss_min_eps=0.0, dss_alpha=1.0,
                 dss_alpha_growth=1.0, dss_alpha_max=1e4, dss_passes=0, dss_compile="off", label_smoothing=0.0,
                 sentence_avg=False, decoding_path="static-cache"):
        super().__init__(task)
        check_options(DSSConfig, locals())
        self.path = str(decoding_path)
        with as_options(DSSConfig):
            check_eps_schedule(str(dss_schedule), dss_decay_k, dss_decay_slope, dss_min_eps)
        if str(dss_compile) == "on" and dss_passes != 0:
            raise ConfigError(f"--dss-compile on compiles the exact pass's decoder step; it needs --dss-passes 0, "
                              f"got --dss-passes {dss_passes}")
        if not dss_alpha_max >= dss_alpha:
            raise ConfigError(f"--dss-alpha-max must be >= --dss-alpha, got {dss_alpha_max} and {dss_alpha}")
        self.mode = str(dss_mode)
        self.schedule = str(dss_schedule)
        self.unit = str(dss_schedule_unit)
        self.warmup = dss_warmup
        self.warmup_updates = int(dss_warmup_updates)
        self.unfed_since = None  # the update since which no position was model-fed, after the warm-up in updates
        self.warned = False
        self.k, self.slope, self.min_eps = dss_decay_k, dss_decay_slope, dss_min_eps
        self.alpha0, self.alpha_growth, self.alpha_max = dss_alpha, dss_alpha_growth, dss_alpha_max
        self.passes = dss_passes
        self.compiled = str(dss_compile) == "on"
        self.label_smoothing = label_smoothing
        self.sentence_avg = sentence_avg
        self.clock = TrainingClock(task)
        check_model_at_start(task, lambda model: check_step_decodable(
            model, "--criterion differentiable_scheduled_sampling"))

    def schedule_values(self):
        """(eps, alpha) at the clock's current epoch / update."""
        counter = self.clock.counter(self.unit)
        eps = teacher_forcing_prob(self.schedule, counter, self.warmup, self.k, self.slope, self.min_eps)
        if self.clock.num_updates < self.warmup_updates:
            eps = 1.0
        alpha = exponential_growth(self.alpha0, self.alpha_growth, counter - self.warmup, self.alpha_max)
        return eps, alpha

    def model_fed_mask(self, prev_output_tokens: torch.Tensor, eps: float) -> torch.Tensor:
        """(N, T) bool: positions fed the model's decision, each with probability
        1 - eps; never position 0 (the BOS / EOS that starts decoding) or padding."""
        fed = torch.rand(prev_output_tokens.shape, device=prev_output_tokens.device) >= eps
        fed[:, 0] = False
        return fed & prev_output_tokens.ne(self.padding_idx)

    def forward(self, model, sample, reduce=True):
        return forward_in_wrapper(model, self._forward, sample)

    def _forward(self, model, sample):
        net_input = sample["net_input"]
        eps, alpha = self.schedule_values()
        fed = None
        if model.training and eps < 1.0:
            fed = self.model_fed_mask(net_input["prev_output_tokens"], eps)
        if fed is None or not bool(fed.any()):
            logits = model(**net_input)[0]
        else:
            logits, _ = run_scheduled_sampling(model, net_input, fed, self.mode, alpha, self.passes,
                                               make_noise_fn(self.mode), path=self.path,
                                               compiled=self.compiled)
        lprobs = model.get_normalized_probs((logits, None), log_probs=True)
        target = model.get_targets(sample, (logits, None))
        loss, nll_loss = label_smoothed_nll(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                            self.label_smoothing, self.padding_idx)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if model.training:
            self.watch_feeding(fed is not None and bool(fed.any()), eps)
            logging_output.update(dss_eps=eps, dss_alpha=alpha, dss_steps=1,
                                  dss_model_fed=0 if fed is None else int(fed.sum()))
        return loss, sample_size, logging_output

    UNFED_UPDATES = 100  # updates after the warm-up in updates with nothing model-fed before the warning

    def watch_feeding(self, fed_any: bool, eps: float) -> None:
        """Warn once, naming the option, when no position has been fed the model's decisions
        for ``UNFED_UPDATES`` updates after ``--dss-warmup-updates``: the run is plain
        cross-entropy (an epoch warm-up longer than the run, or a decay too gentle)."""
        now = self.clock.num_updates
        if fed_any or now < self.warmup_updates:
            self.unfed_since = None
            return
        if self.unfed_since is None:
            self.unfed_since = now
        if self.warned or now - self.unfed_since < self.UNFED_UPDATES:
            return
        self.warned = True
        if eps >= 1.0:
            unit = f"{self.unit}s" if self.warmup != 1 else self.unit
            at = self.clock.epoch if self.unit == "epoch" else self.clock.num_updates
            cause = (f"eps is 1: --dss-warmup {self.warmup:g} {unit} of teacher forcing, and the run is at "
                     f"{self.unit} {at}; count the warm-up in "
                     "updates (--dss-warmup 0 --dss-warmup-updates N), or 0 from a trained model")
        else:
            cause = (f"eps is {eps:.4f}, so close to 1 that no position was fed; lower --dss-decay-k or use "
                     "--dss-schedule-unit update")
        logger.warning(f"differentiable_scheduled_sampling: no position was fed the model's decisions in the "
                       f"{now - self.unfed_since} updates since update {self.unfed_since}: the run is plain "
                       f"cross-entropy so far ({cause})")

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = functools.partial(summed, logging_outputs)
        _, ntokens = log_cross_entropy(logging_outputs)
        steps = total("dss_steps")
        if steps > 0:
            metrics.log_scalar("dss_eps", total("dss_eps") / steps, steps, round=4)
            metrics.log_scalar("dss_alpha", total("dss_alpha") / steps, steps, round=3)
            metrics.log_scalar("dss_fed", total("dss_model_fed") / max(ntokens, 1), ntokens, round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
