"""Shared skeleton of the action-space baselines ``mrt`` and ``pg``: decode
candidates, score them with the task loss, differentiate log p(y | x) of each
candidate, combine (the subclass's estimator), add the reference NLL term, log
(with the candidates' length ratio to the references and repeated 4-grams,
``len_ratio`` and ``rep4``; in validation also the greedy output's,
``greedy_len_ratio`` and ``greedy_rep4``).
The loss is summed over inputs; the sample size is the number of sentences.

The MLE term is ``mle_weight`` times the reference's per-token NLL, -log p(y* | x)
/ |y*| (EOS counted), per input: each sentence's loss is its risk plus w times a
mean token NLL, the scale on which Edunov et al. (2018) mix a token-level loss
into a sequence risk, so that the familiar weights 0.1-0.5 mean what they mean
there. (Their token loss averages over the batch's tokens; ours averages within
each sentence, which keeps the loss a sum over sentences, so data-parallel
training and ``--update-freq`` stay exact.) The references are scored in the
candidates' teacher-forced forward: one encoder pass and one decoder call for both."""
from typing import Dict, List, Tuple

import torch
from fairseq.criterions import FairseqCriterion
from torch import Tensor

from fairseq_ext.runtime import fixes
from fairseq_ext.runtime.clock import check_model_at_start
from fairseq_ext.runtime.distributed import forward_in_wrapper
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.decoding.batch import Decoded, decode_batch
from fairseq_ext.decoding.candidates import DecodeConfig
from fairseq_ext.scoring.teacher_forced import pad_columns, sequence_log_probs
from fairseq_ext.costs.batch_scorer import BatchScorer, continues_prefixes
from fairseq_ext.criterions.logged_metrics import (candidate_shape, log_cost_seconds, log_output_shape,
                                                   log_sentence_means, log_term_means, term_sums)


def check_candidate_model(task, model, criterion: str) -> None:
    """Candidates are decoded from a source (encoder-decoder model) or continue a
    prompt (``--task text_completion``, whose ``continues_prefixes``); refuse a
    decoder-only model elsewhere."""
    if getattr(model, "encoder", None) is None and not continues_prefixes(task):
        raise ConfigError(f"--criterion {criterion}: {type(model).__name__} has no encoder; a decoder-only model "
                         f"continues prompts, which --task text_completion provides (got {type(task).__name__})")


class CandidateRiskCriterion(FairseqCriterion):
    LOG_KEYS: Tuple[str, ...] = ("loss", "cost_mean", "nll")

    def __init__(self, task, name: str, scorer: BatchScorer, decode_cfg: DecodeConfig, mle_weight: float):
        super().__init__(task)
        fixes.activate()  # configure_from_training is called by the Trainer (runtime.fixes)
        check_model_at_start(task, lambda model: check_candidate_model(task, model, name))
        self.scorer = scorer
        self.decode_cfg = decode_cfg
        self.greedy_cfg = decode_cfg.greedy()
        self.mle_weight = mle_weight

    def configure_from_training(self, cfg) -> None:
        """The text costs detokenize as the data does (``BatchScorer.configure_text``)."""
        self.scorer.configure_text(cfg, self.task)

    def decode(self, module, sample) -> Decoded:
        """The candidates and the batch as the decoder saw it."""
        return decode_batch(module, sample, self.decode_cfg)

    def candidate_set(self, module, cand, batch) -> Tuple[List[Tensor], Tensor, Tensor]:
        """(hypotheses, index of the input each answers, the hypotheses as one padded
        tensor), grouped by input."""
        return cand.as_list(), cand.source_index, cand.tokens

    def estimator(self, module, sample, hyps: List[Tensor], log_p: Tensor, costs: Tensor) -> Tuple[Tensor, Dict[str, float]]:
        """(per-input loss (B,), extra logged sums) from log p and costs, both (B, S)."""
        raise NotImplementedError

    def forward(self, model, sample, reduce=True):
        return forward_in_wrapper(model, self._forward, sample)

    def _forward(self, module, sample):
        self.scorer.bind_model(module)
        decoded = self.decode(module, sample)
        cand, batch = decoded.candidates, decoded.batch
        hyps, index, tokens = self.candidate_set(module, cand, batch)
        with torch.no_grad():
            costs, per_term = self.scorer.score(hyps, index, batch)
        dictionary = self.task.target_dictionary
        shape = candidate_shape(cand, batch, dictionary)
        if not module.training:  # what the deployed (greedy) decoder outputs, to catch length drift early
            greedy = decode_batch(module, sample, self.greedy_cfg).candidates
            shape.update(candidate_shape(greedy, batch, dictionary, prefix="greedy_"))
        prefix = batch.get("prefix")
        bsz, n = sample["nsentences"], len(hyps)
        if self.mle_weight > 0:  # the references, scored in the same forward
            target, pad = batch["target"], self.padding_idx
            width = max(tokens.size(1), target.size(1))
            tokens = torch.cat([pad_columns(tokens, width, pad), pad_columns(target, width, pad)])
            index = torch.cat([index.to(target.device), torch.arange(bsz, device=target.device)])
        scores = sequence_log_probs(module, batch, tokens, index, prefix_tokens=prefix)
        log_p = scores[:n].view(bsz, -1)
        costs = costs.view(bsz, -1)
        per_input, extra = self.estimator(module, sample, hyps, log_p, costs)
        loss = per_input.sum()
        nll = None
        if self.mle_weight > 0:
            ref_len = batch["target"].ne(self.padding_idx).sum(dim=1).clamp(min=1)
            nll = -scores[n:] / ref_len
            loss = loss + self.mle_weight * nll.sum()
        logging_output = {
            "loss": float(loss.detach()),
            "cost_mean": float(costs.mean()) * bsz,
            "nll": float(nll.detach().sum()) if nll is not None else 0.0,
            "ntokens": sample["ntokens"],
            "nsentences": bsz,
            "sample_size": bsz,
            "cost_seconds": self.scorer.take_seconds(),
            **term_sums(per_term, self.scorer.log_names),
            **shape,
            **extra,
        }
        return loss, bsz, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        log_sentence_means(logging_outputs, cls.LOG_KEYS)
        log_output_shape(logging_outputs)
        log_output_shape(logging_outputs, prefix="greedy_")
        log_cost_seconds(logging_outputs)
        log_term_means(logging_outputs)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
