"""fairseq-generate's hard and soft beam search (``decoding.beam_search.run_beam``) as a
fairseq generator, for the tasks that offer it (``sequence_tagging``,
``translation_search``): its options (``BeamSearchConfig``: ``--search-algorithm``,
``--search-normalization``, ``--search-alpha``), the normalisation a checkpoint was
trained with (kept in its task state by the soft beam criteria), and ``BeamGenerator``.
"""
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import Tensor

from fairseq_ext.core.constraints import above
from fairseq_ext.decoding.beam_search import NORMALIZATIONS, local_scores, run_beam
from fairseq_ext.runtime.cli import ConfigError

logger = logging.getLogger(__name__)

TRAINED_NORMALIZATION = "soft_beam_normalization"  # key in the task state saved with a checkpoint


@dataclass
class BeamSearchConfig(FairseqDataclass):
    """fairseq-generate options of ``BeamGenerator``, shared by the tasks that offer
    it (``sequence_tagging``, ``translation_search``); ``--beam`` sets k."""

    search_algorithm: ChoiceEnum(["fairseq", "hard", "soft"]) = field(
        default="hard",
        metadata={"help": "fairseq-generate's search: hard beam search ranking by the sum of --search-normalization "
                          "scores (the default: the checkpoint's own normalisation, the measured best), fairseq's "
                          "SequenceGenerator (--beam, renormalised scores, length penalty), or soft beam decoding "
                          "(thesis 4.3.4) with --search-alpha",
                  "deprecated": ("--tagging-search", "--translation-search")})
    search_normalization: ChoiceEnum(["checkpoint", *NORMALIZATIONS]) = field(
        default="checkpoint", metadata={"help": "scores of the hard / soft search: the --soft-beam-normalization the "
                                                "checkpoint was trained with (local if none), log-softmax (local) or "
                                                "raw logits (global, a globally normalised model)"})
    search_alpha: float = field(default=1.0, metadata={"help": "alpha of the soft search (section 4.3.4)",
                                                       "constraint": above(0)})


def trained_normalization(task) -> Optional[str]:
    """The ``--soft-beam-normalization`` a soft beam criterion trained the checkpoint loaded
    into ``task`` with (``remember_normalization``; fairseq-generate loads the
    checkpoint's task state into the decoding task), or None."""
    state = getattr(task, "state", None)
    return None if state is None else state.state_dict.get(TRAINED_NORMALIZATION)


def remember_normalization(task, normalization: str) -> None:
    """Keep ``normalization`` in ``task``'s state, which fairseq saves in every
    checkpoint (``task_state``)."""
    if getattr(task, "state", None) is not None:
        task.state.merge_state_dict({TRAINED_NORMALIZATION: normalization})


def build_beam_generator(task, models, tgt_dict, args, cfg: BeamSearchConfig, search: Optional[str] = None,
                         option: str = "--search-algorithm", **kwargs):
    """The ``BeamGenerator`` of ``task`` for ``search`` hard / soft (default:
    ``cfg.search_algorithm``; ``option`` names the choice in errors); None for
    ``fairseq`` (use fairseq's generator). ``--search-normalization checkpoint`` is
    the normalisation the checkpoint was trained with (local if it names none); a
    different one, asked for, or fairseq's (renormalising) search for a globally
    trained checkpoint, gets a warning."""
    search = str(cfg.search_algorithm) if search is None else search
    if getattr(args, "sampling", False):  # the beam searches do not sample: fairseq's sampling generator
        if search == "soft":
            raise ConfigError(f"--sampling needs {option} fairseq or hard (soft beam decoding does not sample)")
        if search == "hard":
            logger.info(f"--sampling: fairseq's sampling generator ({option} hard applies to beam search)")
        search = "fairseq"
    trained = trained_normalization(task)
    asked = str(cfg.search_normalization)
    normalization = asked if asked != "checkpoint" else (trained or "local")
    if search == "fairseq":
        if trained == "global":
            logger.warning(f"this checkpoint was trained with --soft-beam-normalization global, but {option} "
                           f"fairseq renormalises its scores; use {option} hard or soft")
        return None
    if trained is not None and asked != "checkpoint" and asked != trained:
        logger.warning(f"--search-normalization {asked}, but this checkpoint was trained with "
                       f"--soft-beam-normalization {trained}")
    return BeamGenerator(models, tgt_dict, getattr(args, "beam", 5), cfg.search_alpha, normalization,
                         soft=search == "soft", **kwargs)


class BeamGenerator:
    """A fairseq generator (``generate(models, sample, **kwargs)``) over ``run_beam``:
    soft beam decoding (section 4.3.4: the relaxed recursion, hard backpointers as
    the MAP of the soft ones) or hard beam search ranked by the sum of local
    (log-softmax) or global (raw) scores; fairseq's ``SequenceGenerator`` always
    renormalises, which is wrong for a globally normalised model.

    Horizon: each sentence's source length (tagging: one label per word, then EOS),
    or, given ``max_len_a`` / ``max_len_b`` (translation), an open length ended by
    EOS within fairseq's limit: ``max_len_a * S + max_len_b`` tokens (S the batch's
    padded source width, EOS included, as fairseq's ``SequenceGenerator``; at most
    the decoder's ``max_positions`` - 1) followed by EOS
    (``run_beam(stop_at_eos=True)``).

    Hypotheses: the ``beam`` final elements, best first, with ``score`` the final
    s_T (soft: the relaxed score; never length-normalised) and
    ``positional_scores`` the teacher-forced per-token scores of the returned tokens
    under the same normalisation."""

    def __init__(self, models, tgt_dict, beam: int = 3, alpha: float = 1.0, normalization: str = "local",
                 soft: bool = True, max_len_a: Optional[float] = None, max_len_b: int = 200):
        if len(models) != 1:
            raise ConfigError("soft / raw-score beam search decodes with one model (no ensembles)")
        if beam < 1:
            raise ConfigError(f"--beam must be >= 1, got {beam}")
        self.model, self.tgt_dict = models[0], tgt_dict
        self.beam, self.alpha, self.normalization, self.soft = beam, alpha, normalization, soft
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.eos = tgt_dict.eos()  # fairseq-generate strips it from the printed output
        local_scores(torch.zeros(1, 1), normalization)  # validates

    def cuda(self):
        return self

    def _horizon(self, src: Tensor) -> Tensor:
        """(B,) steps of the search, EOS included."""
        if self.max_len_a is None:
            return src.ne(self.tgt_dict.pad()).sum(1)
        max_len = min(int(self.max_len_a * src.size(1) + self.max_len_b), self.model.max_decoder_positions() - 1)
        if max_len < 1:
            raise ConfigError(f"--max-len-a {self.max_len_a} / --max-len-b {self.max_len_b} allow {max_len} tokens "
                              "before EOS; at least 1 is needed")
        return torch.full((src.size(0),), max_len + 1, dtype=torch.long, device=src.device)

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        model = self.model
        model.eval()
        net_input = sample["net_input"]
        src = net_input["src_tokens"]
        horizon = self._horizon(src)
        open_length = self.max_len_a is not None
        result = run_beam(model, net_input, horizon, self.beam, self.alpha, self.normalization, hard=not self.soft,
                          stop_at_eos=open_length)
        B, k, _ = result.tokens.shape
        rows = torch.arange(B, device=src.device).repeat_interleave(k)
        tokens = result.tokens.view(B * k, -1)
        prev = torch.cat([torch.full_like(tokens[:, :1], self.tgt_dict.eos()), tokens[:, :-1]], dim=1)
        prev = prev.masked_fill(prev.eq(self.tgt_dict.pad()), self.tgt_dict.eos())
        encoder_out = model.encoder.reorder_encoder_out(
            model.encoder(src, src_lengths=net_input.get("src_lengths")), rows)
        f = local_scores(model.decoder(prev, encoder_out=encoder_out)[0], self.normalization)
        positional = f.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).view(B, k, -1)
        if open_length:  # up to the first EOS (run_beam ends every live element with one; dead ones are dropped)
            lengths = result.tokens.eq(self.eos).int().argmax(-1) + 1
        else:
            lengths = horizon.view(B, 1).expand(B, k)
        out = []
        for b in range(B):
            order = [i for i in result.scores[b].argsort(descending=True).tolist()
                     if torch.isfinite(result.scores[b, i])]
            out.append([{"tokens": result.tokens[b, i, : int(lengths[b, i])], "score": result.scores[b, i],
                         "positional_scores": positional[b, i, : int(lengths[b, i])], "alignment": torch.empty(0),
                         "attention": None} for i in order])
        return out
