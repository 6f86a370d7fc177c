"""Relaxed (soft) beam search over a stock fairseq decoder (Goyal thesis,
Algorithm 3), and the hard beam search it tends to as alpha -> inf.

The decoder runs incrementally on B x k rows (sentence-major, beam-minor, as in
fairseq). At every step its scores feed ``core.soft_beam.soft_beam_step``; the next
input of element i is the soft output a_i^T E, fed through the embedding hook of
``soft_inputs``, and the decoder's whole incremental state is mixed by the soft
backpointers (``SoftReorder``). ``hard=True`` runs the discrete beam instead
(exact top-k, index reorders, token inputs): the alpha -> inf limit, and a beam
search that ranks by raw scores when ``normalization="global"``.

Each sentence b is searched over a fixed horizon of ``horizon[b]`` steps (the gold
length, EOS included); past it, the sentence's elements are frozen (scores, costs
and states unchanged). Scores are log-softmax outputs (``local``) or the raw
logits (``global``, chapter 5).
"""
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq_ext.core.soft_beam import hard_beam_step, soft_beam_step
from fairseq_ext.generators.soft_inputs import (
    EmbeddingOverride,
    SoftReorder,
    check_plain_output_layer,
    decoder_embedding,
)

NORMALIZATIONS = ("local", "global")


@dataclass
class BeamResult:
    """scores: (B, k) final s_T (-inf: dead element); costs: (B, k) final D_T;
    tokens: (B, k, T) each element's output sequence, followed along the hard
    backpointers (pad past the sentence's horizon); best: (B,) index of the
    element with the highest final score."""

    scores: Tensor
    costs: Tensor
    tokens: Tensor
    best: Tensor

    def best_tokens(self) -> Tensor:
        """(B, T) the highest-scoring element's sequence."""
        return self.tokens[torch.arange(self.tokens.size(0)), self.best]


def local_scores(logits: Tensor, normalization: str) -> Tensor:
    """f(h, w): log-probabilities (``local``) or the raw logits (``global``)."""
    if normalization == "local":
        return torch.log_softmax(logits.float(), dim=-1)
    if normalization == "global":
        return logits.float()
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")


def run_beam(
    model,
    net_input: Dict[str, Tensor],
    horizon: Tensor,
    beam: int,
    alpha: float = 1.0,
    normalization: str = "local",
    step_costs: Optional[Tensor] = None,
    augment: bool = False,
    hard: bool = False,
) -> BeamResult:
    """Soft (Algorithm 3) or hard (Algorithm 1) beam search for a batch.

    horizon: (B,) steps per sentence. step_costs: (B, T, V) d_t(w) (Hamming, see
    ``core.soft_beam.hamming_step_costs``), T = max horizon; accumulated into the
    costs, and added to the candidate scores when ``augment``.
    """
    decoder = model.decoder
    check_plain_output_layer(decoder)
    embedding = decoder_embedding(decoder)
    src = net_input["src_tokens"]
    B, k, device = src.size(0), beam, src.device
    rows = torch.arange(B, device=device).repeat_interleave(k)
    encoder_out = model.encoder(src, src_lengths=net_input.get("src_lengths"))
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, rows)
    eos = decoder.dictionary.eos()
    T = int(horizon.max())
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    costs = torch.zeros(B, k, device=device)
    eye = torch.eye(k, device=device).expand(B, k, k)
    identity = torch.arange(k, device=device).expand(B, k)
    padding = torch.full_like(identity, decoder.dictionary.pad())
    first_row = torch.arange(B, device=device).view(B, 1) * k
    all_rows = torch.ones(B * k, 1, dtype=torch.bool, device=device)
    reorder = SoftReorder(decoder)
    state: Dict = {}
    inputs: Optional[Tensor] = None  # (B*k, E) soft inputs (the hard beam feeds tokens through prev)
    prev = torch.full((B * k, 1), eos, dtype=torch.long, device=device)
    back_hist: List[Tensor] = []
    out_hist: List[Tensor] = []
    with EmbeddingOverride(embedding) as override:
        for t in range(T):
            if t > 0 and not hard:
                override.set(all_rows, inputs.unsqueeze(1))
            logits = decoder(prev, encoder_out=encoder_out, incremental_state=state)[0][:, -1]
            f = local_scores(logits, normalization).view(B, k, -1)
            d = None if step_costs is None else step_costs[:, t]
            if hard:
                step = hard_beam_step(scores, f, k, costs, d, augment)
            else:
                step = soft_beam_step(scores, f, alpha, k, costs, d, augment)
            act = (t < horizon).to(device).view(B, 1)
            scores = torch.where(act, step.scores, scores)
            costs = torch.where(act, step.costs, costs)
            mix = torch.where(act.unsqueeze(-1), step.backpointers, eye)
            back_hist.append(torch.where(act, step.hard_backpointers, identity))
            out_hist.append(torch.where(act, step.hard_outputs, padding))
            if t + 1 == T:
                break
            if hard:
                order = (first_row + back_hist[-1]).view(-1)
                decoder.reorder_incremental_state(state, order)
                prev = torch.cat([prev.index_select(0, order), out_hist[-1].view(-1, 1)], dim=1)
            else:
                reorder(state, mix.reshape(B * k, k), B)
                inputs = (step.outputs @ embedding.weight.to(step.outputs.dtype)).view(B * k, -1)
                prev = torch.cat([prev, prev[:, -1:]], dim=1)
    best = scores.argmax(-1)
    return BeamResult(scores, costs, _follow_backpointers(back_hist, out_hist), best)


def _follow_backpointers(back_hist: List[Tensor], out_hist: List[Tensor]) -> Tensor:
    """(B, k, T) sequences of every final element, traced back through the hard
    backpointers (Algorithm 1, line 11)."""
    B, k = back_hist[0].shape
    element = torch.arange(k, device=back_hist[0].device).expand(B, k)
    tokens = []
    for back, out in zip(reversed(back_hist), reversed(out_hist)):
        tokens.append(out.gather(1, element))
        element = back.gather(1, element)
    return torch.stack(tokens[::-1], dim=-1)


class BeamGenerator:
    """A fairseq generator (``generate(models, sample, **kwargs)``) over ``run_beam``
    with a horizon of each sentence's source length (tagging: one label per word,
    then EOS): soft beam decoding (section 4.3.4: the relaxed recursion, hard
    backpointers as the MAP of the soft ones) or hard beam search ranked by the sum
    of local (log-softmax) or global (raw) scores; fairseq's ``SequenceGenerator``
    always renormalises, which is wrong for a globally normalised model.

    Hypotheses: the ``beam`` final elements, best first, with ``score`` the final
    s_T (soft: the relaxed score) and ``positional_scores`` the teacher-forced
    per-token scores of the returned tokens under the same normalisation."""

    def __init__(self, models, tgt_dict, beam: int = 3, alpha: float = 1.0, normalization: str = "local",
                 soft: bool = True):
        if len(models) != 1:
            raise ValueError("soft / raw-score beam search decodes with one model (no ensembles)")
        if beam < 1:
            raise ValueError(f"--beam must be >= 1, got {beam}")
        self.model, self.tgt_dict = models[0], tgt_dict
        self.beam, self.alpha, self.normalization, self.soft = beam, alpha, normalization, soft
        self.eos = tgt_dict.eos()  # fairseq-generate strips it from the printed output
        local_scores(torch.zeros(1, 1), normalization)  # validates

    def cuda(self):
        return self

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        model = self.model
        model.eval()
        net_input = sample["net_input"]
        src = net_input["src_tokens"]
        horizon = src.ne(self.tgt_dict.pad()).sum(1)
        result = run_beam(model, net_input, horizon, self.beam, self.alpha, self.normalization, hard=not self.soft)
        B, k, _ = result.tokens.shape
        rows = torch.arange(B, device=src.device).repeat_interleave(k)
        tokens = result.tokens.view(B * k, -1)
        prev = torch.cat([torch.full_like(tokens[:, :1], self.tgt_dict.eos()), tokens[:, :-1]], dim=1)
        prev = prev.masked_fill(prev.eq(self.tgt_dict.pad()), self.tgt_dict.eos())
        encoder_out = model.encoder.reorder_encoder_out(
            model.encoder(src, src_lengths=net_input.get("src_lengths")), rows)
        f = local_scores(model.decoder(prev, encoder_out=encoder_out)[0], self.normalization)
        positional = f.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).view(B, k, -1)
        out = []
        for b in range(B):
            n = int(horizon[b])
            order = [i for i in result.scores[b].argsort(descending=True).tolist()
                     if torch.isfinite(result.scores[b, i])]
            out.append([{"tokens": result.tokens[b, i, :n], "score": result.scores[b, i],
                         "positional_scores": positional[b, i, :n], "alignment": torch.empty(0),
                         "attention": None} for i in order])
        return out
