"""``--criterion mgs``: MLE-guided parameter search (Welleck & Cho, Algorithm 1).

A thin fairseq adapter around ``fairseq_ext.core.parameter_search``. Each training step:
decode the batch with theta and compute the pooled task loss C(theta); compute
the MLE gradient g (per-token NLL pooled over workers, clipped to
``--mgs-mle-clip``); for k = 1..K perturb theta in place by Delta_k ~ q (eq. 4),
decode, compute C(theta + Delta_k), restore theta bitwise; weight the candidates
(eq. 3), clip Delta to ``--mgs-direction-clip`` (1.0, as the published code clips
its update) and hand -Delta to fairseq's optimizer as the gradient. The returned loss
is the surrogate sum_p <p, -Delta_p>, whose gradient is exactly -Delta, so
``--optimizer``, ``--lr-scheduler``, ``--clip-norm``, ``--update-freq`` (the
micro-batch directions are averaged), checkpointing and data parallelism are
fairseq's own. The sample size is 1 per micro-batch and worker.

With ``--mgs-candidate-evaluation batched`` (the default) theta and its K perturbations
are decoded together: the K + 1 parameter sets are written into one (K + 1, P) tensor
(``core.parameter_search.StackedSets``, the values ``perturbed`` gives the parameters)
and decoded in one pass of the static-cache step with grouped weights
(``decode_grouped``), for greedy or sampled decoding of ``transformer``,
``transformer_lm``, ``lstm`` and ``lstm_lm`` decoders; elsewhere (or with
``--decoding-path fairseq``), or with ``sequential``, the candidates are decoded one
after another, the parameters perturbed in place (one extra copy of the parameters
instead of K + 1). Either way the update is ``ParameterSearch``'s, in its lean mode
for ``sequential``.

Validation computes the MLE loss and the task losses of greedy decodes, so
``--best-checkpoint-metric task_loss`` selects on the task loss.
"""
import functools
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum
from omegaconf import II

from fairseq_ext.criterions.logged_metrics import summed
from fairseq_ext.runtime import fixes
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.constraints import above
from fairseq_ext.core.parameter_search import (IMPORTANCE, NOISE_SCALES, PROPOSALS, ParameterSearch, ProposalConfig,
                                              StackedSets)
from fairseq_ext.core.parameter_search import clip_grad_, mgs_weights, mix_seed, weight_stats
from fairseq_ext.runtime.clock import TrainingClock, check_model_at_start
from fairseq_ext.runtime.distributed import all_reduce_sum_, pooled_mean, pooled_means, unwrap
from fairseq_ext.runtime.validation import check_options
from fairseq_ext.decoding.batch import decode_batch
from fairseq_ext.decoding.candidates import STRATEGIES, DecodeConfig, ParameterSets, grouped_reason
from fairseq_ext.decoding.steps import DecodingPathConfig
from fairseq_ext.costs.sequence_cost import POST_PROCESS_HELP
from fairseq_ext.tasks.text_completion import TextCompletionTask
from fairseq_ext.core.task_losses import TASK_LOSS_SPEC
from fairseq_ext.costs.batch_scorer import TASK_LOSS_HELP, BatchScorer
from fairseq_ext.criterions.candidate_risk import check_candidate_model
from fairseq_ext.criterions.logged_metrics import (candidate_shape, log_cost_seconds, log_output_shape,
                                                   log_term_means, term_sums)

logger = logging.getLogger(__name__)
EVALUATIONS = ("batched", "sequential")


def default_alpha(task) -> float:
    """``--mgs-alpha``'s default: 1 for text completion (LM costs are NLLs in nats, whose
    differences are of order one; the paper's A.4), 100 elsewhere (translation: sBLEU or edit
    costs differ by about 0.01 between candidates, and at alpha 1 the weights are uniform;
    the paper's grid-searched MT value)."""
    return 1.0 if isinstance(task, TextCompletionTask) else 100.0


@dataclass
class MGSConfig(DecodingPathConfig):
    mgs_candidates: int = field(default=4, metadata={"help": "K, candidate directions per update",
                                                     "parameter": (ProposalConfig, "num_candidates")})
    mgs_mixture: float = field(default=0.5, metadata={"help": "pi, probability of the zero-mean component (eq. 4)",
                                                      "parameter": (ProposalConfig, "mixture")})
    mgs_alternate: bool = field(
        default=False, metadata={"help": "alternate the components (even k: MLE, odd k: zero-mean, as the published "
                                         "code) instead of sampling"}
    )
    mgs_proposal: ChoiceEnum(PROPOSALS) = field(
        default="mixture", metadata={"help": "proposal: the mixture, or only its zero / MLE component (Table 7)",
                                     "parameter": (ProposalConfig, "proposal")}
    )
    mgs_noise: float = field(default=1.0, metadata={"help": "noise level: sigma = noise x mean|g| (see --mgs-noise-scale)",
                                                    "parameter": (ProposalConfig, "noise")})
    mgs_noise_scale: ChoiceEnum(NOISE_SCALES) = field(
        default="per_tensor",
        metadata={"help": "sigma per weight tensor (noise x mean|g_w|, A.4), one global sigma, or absolute (sigma = noise)",
                  "parameter": (ProposalConfig, "noise_scale")},
    )
    mgs_importance: ChoiceEnum(IMPORTANCE) = field(
        default="unit",
        metadata={"help": "density for log q: unit variance (published code), exact sigmas, or none (reward-weighted)",
                  "parameter": (ProposalConfig, "importance")},
    )
    mgs_alpha: Optional[float] = field(
        default=None, metadata={"help": "alpha, temperature of the candidate weights (eq. 2); default: 100 where "
                                        "candidates answer a source sentence (translation), 1 for text completion, "
                                        "the paper's values and the measured ones (docs/mgs.md)",
                                "constraint": above(0)})
    mgs_task_loss: str = field(
        default="sbleu", metadata={"help": TASK_LOSS_HELP.format(what="task loss C"), "constraint": TASK_LOSS_SPEC}
    )
    mgs_decoder: ChoiceEnum(STRATEGIES) = field(
        default="greedy", metadata={"help": "decoding algorithm F used to compute C",
                                    "parameter": (DecodeConfig, "strategy")}
    )
    mgs_beam: int = field(default=4, metadata={"help": "beam size when --mgs-decoder beam",
                                               "parameter": (DecodeConfig, "beam_size")})
    mgs_max_len_ratio: float = field(
        default=1.3, metadata={"help": "maximum decoding length: this times the longest reference in the batch",
                               "parameter": (DecodeConfig, "max_len_ref_ratio")}
    )
    mgs_mle_clip: float = field(default=1.0, metadata={"help": "clip the MLE gradient to this L2 norm (<= 0: off)"})
    mgs_direction_clip: float = field(
        default=1.0, metadata={"help": "clip the update direction Delta to this L2 norm before the optimizer, as the "
                                       "published code does (<= 0: off; --clip-norm then clips fairseq's gradient)"}
    )
    mgs_score_model: Optional[str] = field(
        default=None, metadata={"help": "checkpoint scoring the lm cost (default: frozen copy of the starting model)"}
    )
    mgs_post_process: str = field(default="auto", metadata={"help": POST_PROCESS_HELP})
    mgs_candidate_evaluation: ChoiceEnum(EVALUATIONS) = field(
        default="batched",
        metadata={"help": "batched: theta and its K perturbations decoded together, one pass (K + 1 copies of the "
                          "parameters in memory; greedy or sampled decoding of transformer, transformer_lm, lstm and lstm_lm "
                          "decoders, else "
                          "sequential, said once in the log); sequential: one candidate after another, the "
                          "parameters perturbed in place (one extra copy)"},
    )
    seed: int = II("common.seed")


@register_criterion("mgs", dataclass=MGSConfig)
class MGSCriterion(FairseqCriterion):
    def __init__(self, task, mgs_candidates=4, mgs_mixture=0.5, mgs_alternate=False, mgs_proposal="mixture",
                 mgs_noise=1.0, mgs_noise_scale="per_tensor", mgs_importance="unit", mgs_alpha=None,
                 mgs_task_loss="sbleu", mgs_decoder="greedy", mgs_beam=4, mgs_max_len_ratio=1.3, mgs_mle_clip=1.0,
                 mgs_direction_clip=1.0, mgs_score_model=None, mgs_post_process="auto",
                 mgs_candidate_evaluation="batched", decoding_path="static-cache",
                 seed=1):
        super().__init__(task)
        fixes.activate()  # configure_from_training is called by the Trainer (runtime.fixes)
        check_options(MGSConfig, locals())
        if mgs_score_model and not os.path.isfile(mgs_score_model):
            raise ConfigError(f"--mgs-score-model: no such file {mgs_score_model}")
        check_model_at_start(task, lambda model: check_candidate_model(task, model, "mgs"))
        self.proposal = ProposalConfig(
            num_candidates=mgs_candidates, mixture=mgs_mixture, alternate=mgs_alternate, proposal=str(mgs_proposal),
            noise=mgs_noise, noise_scale=str(mgs_noise_scale), importance=str(mgs_importance),
        )
        if mgs_alpha is None:  # the recommended value for the task: costs of order 1 (LM NLLs) or 0.01 (sBLEU)
            mgs_alpha = default_alpha(task)
            logger.info(f"mgs: --mgs-alpha {mgs_alpha:g} (the default for {type(task).__name__})")
        self.alpha = mgs_alpha
        self.mle_clip = mgs_mle_clip
        self.direction_clip = mgs_direction_clip
        self.scorer = BatchScorer(task, mgs_task_loss, post_process=mgs_post_process, score_model=mgs_score_model,
                                   criterion="mgs")
        decoder = str(mgs_decoder)
        self.decode_cfg = DecodeConfig(
            strategy=decoder, beam_size=mgs_beam if decoder == "beam" else None, max_len_ref_ratio=mgs_max_len_ratio,
            path=str(decoding_path))
        self.greedy_cfg = self.decode_cfg.greedy()
        self.batched = str(mgs_candidate_evaluation) == "batched"
        self.stacked_sets = StackedSets()  # theta and its K perturbations, for the grouped decode
        self.seed = seed
        self.clock = TrainingClock(task)
        self._update_key = (None, 0)

    def configure_from_training(self, cfg) -> None:
        """The text costs detokenize as the data does (``BatchScorer.configure_text``)."""
        self.scorer.configure_text(cfg, self.task)

    # ---------------------------------------------------------------- helpers
    def _step_seed(self) -> int:
        """One seed per (update, micro-batch), identical on all workers and after resuming.

        The update count is the one fairseq hands ``task.train_step`` (``TrainingClock``),
        not fairseq's logged ``num_updates`` meter: a resume replaces the "default"
        aggregator that meter is read from while fairseq keeps logging into the old one,
        so the meter stays at the checkpoint's count for the rest of the run."""
        num_updates = self.clock.num_updates
        last, micro = self._update_key
        micro = micro + 1 if last == num_updates else 0
        self._update_key = (num_updates, micro)
        return mix_seed(self.seed, num_updates, micro)

    def _pooled_cost(self, model, sample, cfg, generator=None):
        """(C(theta) = mean per-sequence task loss, pooled over workers; the candidates; the
        batch as the decoder saw it; the cost terms' sums, ``term_sums``)."""
        decoded = decode_batch(model, sample, cfg, generator)
        cand, batch = decoded.candidates, decoded.batch
        total, per_term = self.scorer.score(cand.as_list(), cand.source_index, batch)
        return pooled_mean(total), cand, batch, term_sums(per_term, self.scorer.log_names)

    def _nll(self, module, sample):
        """(the summed token NLL of the references, the targets), teacher-forced."""
        net_output = module(**sample["net_input"])
        lprobs = module.get_normalized_probs(net_output, log_probs=True)
        target = module.get_targets(sample, net_output)
        nll = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                           ignore_index=self.padding_idx, reduction="sum")
        return nll, target

    def _mle_gradient(self, module, sample):
        """(params, g: the per-token NLL gradient pooled over workers, one flat vector (the
        parameters' in order), this worker's summed NLL and ntokens)."""
        params = [p for p in module.parameters() if p.requires_grad]
        nll, target = self._nll(module, sample)
        grads = torch.autograd.grad(nll, params, allow_unused=True)
        flat = torch.cat([(torch.zeros_like(p) if g is None else g.detach()).reshape(-1) for p, g in zip(params, grads)])
        del grads
        local_ntokens = float(target.ne(self.padding_idx).sum())
        ntokens = all_reduce_sum_(torch.tensor(local_ntokens, dtype=torch.float64, device=nll.device))
        all_reduce_sum_(flat)
        flat.div_(max(float(ntokens), 1.0))
        return params, flat, float(nll.detach()), local_ntokens

    def _batched_for(self, module) -> bool:
        """Whether this model's candidates are decoded together (said once when they cannot be)."""
        if not self.batched:
            return False
        reason = grouped_reason(module, self.decode_cfg)
        if reason is not None:
            logger.info(f"mgs: candidates decoded one at a time (--mgs-candidate-evaluation batched: {reason})")
            self.batched = False
        return self.batched

    def _sampling_generator(self, device, seed: int) -> Optional[torch.Generator]:
        """With ``--mgs-decoder sample``, a generator every candidate's decode starts from
        afresh (theta's and each theta + Delta_k's draw the same numbers); else None. It lives
        where the probabilities do."""
        if self.decode_cfg.strategy != "sample":
            return None
        return torch.Generator(device).manual_seed(mix_seed(seed, 0x5EED))

    def _costs_together(self, module, sample, search, device):
        """(C(theta), the K candidates' costs, their log q and norms, theta's candidates'
        ``output_shape``) from one grouped decode
        (sampling: every set draws from its own ``_sampling_generator``)."""
        count, stack, infos = self.stacked_sets.fill(search)
        sets = ParameterSets(count, stack)
        gens = None
        if self.decode_cfg.strategy == "sample":
            gens = [self._sampling_generator(device, search.seed) for _ in range(sets.count)]
        decoded = decode_batch(module, sample, self.decode_cfg, gens, sets=sets)
        groups, batch = decoded.groups, decoded.batch
        hyps = [h for cand in groups for h in cand.as_list()]
        total, per_term = self.scorer.score(hyps, torch.cat([cand.source_index for cand in groups]), batch)
        means = pooled_means(total.view(sets.count, -1))
        shape = candidate_shape(groups[0], batch, self.task.target_dictionary)
        shape.update(term_sums(per_term, self.scorer.log_names, rows=groups[0].tokens.size(0)))  # theta's terms
        return (float(means[0]), means[1:].tolist(), [i["log_q"] for i in infos], [i["norm"] for i in infos],
                shape)

    def _costs_one_by_one(self, module, sample, search, device):
        """(the K candidates' costs, their log q and norms), theta perturbed in place for each."""
        costs, log_qs, norms = [], [], []
        for k in range(self.proposal.num_candidates):
            with search.perturbed(k) as info:
                gen = self._sampling_generator(device, search.seed)
                ck = self._pooled_cost(module, sample, self.decode_cfg, generator=gen)[0]
            costs.append(float(ck))
            log_qs.append(info["log_q"])
            norms.append(info["norm"])
        return costs, log_qs, norms

    # ---------------------------------------------------------------- forward
    def forward(self, model, sample, reduce=True):
        if not model.training:
            return self._validate(model, sample)
        module = unwrap(model)
        self.scorer.bind_model(module)
        seed = self._step_seed()
        device = next(module.parameters()).device  # a sampling generator must live where the probabilities do
        batched = self._batched_for(module)
        if not batched:
            gen = self._sampling_generator(device, seed)
            c0, cand0, batch0, terms = self._pooled_cost(module, sample, self.decode_cfg, generator=gen)
            c0, shape = float(c0), {**candidate_shape(cand0, batch0, self.task.target_dictionary), **terms}
        params, grads, nll_sum, ntokens = self._mle_gradient(module, sample)
        grad_norm = clip_grad_([grads], self.mle_clip)

        search = ParameterSearch(params, grads, self.proposal, seed)
        if batched:
            c0, costs, log_qs, norms, shape = self._costs_together(module, sample, search, device)
        else:
            costs, log_qs, norms = self._costs_one_by_one(module, sample, search, device)
        costs_t = torch.tensor(costs, dtype=torch.float64)
        log_q_t = torch.tensor(log_qs, dtype=torch.float64)

        finite = bool(torch.isfinite(costs_t).all()) and math.isfinite(float(c0)) and bool(torch.isfinite(log_q_t).all())
        if finite:
            weights = mgs_weights(float(c0), costs_t, log_q_t, self.alpha)
            finite = bool(torch.isfinite(weights).all())
        if finite:
            direction = search.direction(weights, lean=not batched)
            direction_norm = clip_grad_([direction], self.direction_clip)
            # d(surrogate)/dp = -Delta_p
            surrogate = -torch.dot(torch.cat([p.reshape(-1) for p in params]), direction)
            stats = weight_stats(weights, search.is_mle)
        else:
            logger.warning(f"mgs: non-finite task loss or weight (C(theta)={float(c0)}, candidates={costs}); update skipped")
            direction_norm = 0.0
            surrogate = sum(p.view(-1)[:1].sum() * 0.0 for p in params)
            stats = {"weight_entropy": 0.0, "weight_std": 0.0, "mle_weight": 0.0, "top_is_mle": 0.0}

        logging_output = {
            "loss": float(c0),
            "nll_loss": nll_sum,
            "ntokens": ntokens,
            "nsentences": sample["nsentences"],
            "sample_size": 1,
            "mgs_count": 1,
            "mgs_cand_mean": float(costs_t.mean()),
            "mgs_cand_best": float(costs_t.min()),
            "mgs_mle_grad_norm": grad_norm,
            "mgs_cand_norm": sum(norms) / len(norms),
            "mgs_direction_norm": direction_norm,
            "mgs_logq_std": float(log_q_t.std(unbiased=False)),
            "mgs_skipped": 0.0 if finite else 1.0,
            "cost_seconds": self.scorer.take_seconds(),
            **shape,
        }
        logging_output.update({f"mgs_{k}": v for k, v in stats.items()})
        return surrogate, 1, logging_output

    def _validate(self, model, sample):
        module = unwrap(model)
        self.scorer.bind_model(module)
        with torch.no_grad():
            nll, target = self._nll(module, sample)
        decoded = decode_batch(module, sample, self.greedy_cfg)
        cand, batch = decoded.candidates, decoded.batch
        total, per_name = self.scorer.score(cand.as_list(), cand.source_index, batch)
        self.scorer.take_seconds()  # validation's cost time is not an update's
        ntokens = int(target.ne(self.padding_idx).sum())
        logging_output = {
            "loss": float(nll), "nll_loss": float(nll), "ntokens": ntokens, "nsentences": sample["nsentences"],
            "sample_size": ntokens, "valid_task_loss_sum": float(total.sum()),
            "valid_len_sum": float(cand.lengths.sum()), "valid_nonterm_sum": float((~cand.finished).sum()),
            **candidate_shape(cand, batch, self.task.target_dictionary, prefix="greedy_"),
        }
        for name, c in per_name.items():
            logging_output[f"valid_cost_{self.scorer.log_names[name]}_sum"] = float(c.sum())
        return nll, ntokens, logging_output

    # ---------------------------------------------------------------- metrics
    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        total = functools.partial(summed, logging_outputs)
        nsent = total("nsentences")
        ntok = total("ntokens")
        count = total("mgs_count")
        if count > 0:  # training
            metrics.log_scalar("loss", total("loss") / count, count, round=4)
            if ntok > 0:
                metrics.log_scalar("nll_loss", total("nll_loss") / ntok / math.log(2), ntok, round=3)
            for key in ("cand_mean", "cand_best", "weight_entropy", "weight_std", "mle_weight", "top_is_mle",
                        "mle_grad_norm", "cand_norm", "direction_norm", "logq_std", "skipped"):
                metrics.log_scalar(f"mgs_{key}", total(f"mgs_{key}") / count, count, round=4)
            log_output_shape(logging_outputs)
            log_cost_seconds(logging_outputs)
            log_term_means(logging_outputs)
            return
        # validation: MLE loss in base 2 per token (fairseq convention) and the greedy task losses
        if ntok > 0:
            metrics.log_scalar("loss", total("loss") / ntok / math.log(2), ntok, round=3)
            metrics.log_scalar("nll_loss", total("nll_loss") / ntok / math.log(2), ntok, round=3)
            metrics.log_derived("ppl", lambda m: utils.get_perplexity(m["nll_loss"].avg))
        if nsent > 0:
            metrics.log_scalar("task_loss", total("valid_task_loss_sum") / nsent, nsent, round=4)
            metrics.log_scalar("avg_len", total("valid_len_sum") / nsent, nsent, round=2)
            metrics.log_scalar("nonterm", total("valid_nonterm_sum") / nsent, nsent, round=4)
            names = {k[len("valid_cost_"):-len("_sum")] for log in logging_outputs for k in log if k.startswith("valid_cost_")}
            for name in sorted(names):
                metrics.log_scalar(f"cost_{name}", total(f"valid_cost_{name}_sum") / nsent, nsent, round=4)
            log_output_shape(logging_outputs, prefix="greedy_")

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True

