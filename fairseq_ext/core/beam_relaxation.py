"""Continuous relaxation of beam search (Goyal thesis, chapter 4). Pure PyTorch.

Shapes: B sentences, K beam elements in, k beam elements out (K = k after the
first step), V outputs. -inf scores mark forbidden or dead entries; they get
weight 0 everywhere and never turn into NaN (values are masked before they are
squared or multiplied).

- ``continuous_topk_argmax`` (Algorithm 2): p_i = peaked-softmax_alpha(-(s - m_i)^2)
  over all K x V entries of the candidate matrix, m = its top-k values.
- ``soft_beam_step`` (Algorithm 3, lines 5-17): candidate scores
  s~[j, w] = s_j + f_j(w) (+ d(w) for the cost-augmented hinge, section 4.4), the
  soft backpointers b~_i = row sums of p_i (a k x K row-stochastic matrix), the
  output weights a_i = column sums of p_i, the new scores s_i = sum(s~ * p_i) and
  cumulative costs D_i = a_i . d + sum_j b~_i[j] D_j; also the hard beam step's
  choices (the MAP of the soft ones, section 4.3.4).
- ``hard_beam_step``: Algorithm 1's exact top-k step in the same form.
- ``soft_beam_loss`` (line 19, eq. 4.2): L = peaked-softmax_alpha(s_T) . D_T;
  ``soft_max_score``: s_max = peaked-softmax_alpha(s_T) . s_T (hinge, section 4.4).
- ``hamming_step_costs``: the decomposable Hamming cost d_t(w) = c(w) [w != y*_t].
- ``open_length_hamming_costs``: the same cost for hypotheses of any length
  (ended by EOS): Hamming over max(hypothesis, reference) positions, an absent
  position counting as an error.

As alpha -> inf (no ties among the top-k candidates) every p_i tends to the
one-hot top-k index pair, the soft beam to the hard beam and L to the Hamming
cost of the hard beam's best hypothesis (eq. 4.3).
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from fairseq_ext.core.relaxations import peaked_softmax

NEG_INF = float("-inf")


def continuous_topk_argmax(scores: Tensor, k: int, alpha: float) -> Tensor:
    """Algorithm 2 over the last two dims of ``scores`` (..., K, V).

    Returns p (..., k, K, V): p[..., i, :, :] sums to 1 and peaks at the entry
    holding the i-th largest score. Where fewer than k entries are finite, the
    missing p_i are all-zero (a dead beam element)."""
    if k < 1 or k > scores.size(-1) * scores.size(-2):
        raise ValueError(f"k must be in [1, K*V], got {k} for a {tuple(scores.shape[-2:])} candidate matrix")
    flat = scores.flatten(-2)
    finite = torch.isfinite(flat)
    m = flat.topk(k, dim=-1).values  # (..., k), continuous in the scores
    alive = torch.isfinite(m)
    safe = flat.masked_fill(~finite, 0.0)
    dist = -(safe.unsqueeze(-2) - m.masked_fill(~alive, 0.0).unsqueeze(-1)) ** 2  # (..., k, K*V)
    dist = dist.masked_fill(~finite.unsqueeze(-2), NEG_INF)
    p = peaked_softmax(dist, alpha, dim=-1) * alive.unsqueeze(-1).to(scores.dtype)
    return p.view(*scores.shape[:-2], k, *scores.shape[-2:])


@dataclass
class BeamStep:
    """One step of the relaxed beam for B sentences (k elements out, K in).

    backpointers: (B, k, K) soft backpointers b~ (rows sum to 1; 0 for dead elements).
    outputs: (B, k, V) a_i, the soft choice of output; the next input embedding is
        ``outputs @ E``.
    scores: (B, k) s_{t+1}; -inf for dead elements.
    costs: (B, k) D_{t+1}.
    hard_backpointers, hard_outputs: (B, k) the MAP (beam, output) pair of each p_i.
    """

    backpointers: Tensor
    outputs: Tensor
    scores: Tensor
    costs: Tensor
    hard_backpointers: Tensor
    hard_outputs: Tensor


def candidate_scores(beam_scores: Tensor, local_scores: Tensor, step_costs: Optional[Tensor] = None,
                     augment: bool = False) -> Tensor:
    """s~[j, w] = s_j + f_j(w) (+ d(w) when ``augment``): (B, K, V) (line 5 of
    Algorithms 1 and 3; section 4.4 for the cost augmentation)."""
    cand = beam_scores.unsqueeze(-1) + local_scores
    if step_costs is not None and augment:
        cand = cand + step_costs.unsqueeze(1)
    return cand


def soft_beam_step(
    beam_scores: Tensor,
    local_scores: Tensor,
    alpha: float,
    k: int,
    costs: Optional[Tensor] = None,
    step_costs: Optional[Tensor] = None,
    augment: bool = False,
) -> BeamStep:
    """Algorithm 3, lines 5-17, for B sentences.

    beam_scores: (B, K) s_t (-inf: dead element). local_scores: (B, K, V) f(h_{t,j}, w)
    (log-probabilities for local normalisation, raw logits for global; -inf:
    forbidden). costs: (B, K) D_t (default 0). step_costs: (B, V) d_t(w) (default 0).
    augment: add d_t(w) to the candidate scores (the cost-augmented hinge).
    """
    if costs is None:
        costs = torch.zeros_like(beam_scores)
    cand = candidate_scores(beam_scores, local_scores, step_costs, augment)
    p = continuous_topk_argmax(cand, k, alpha)  # (B, k, K, V)
    backpointers = p.sum(-1)
    outputs = p.sum(-2)
    finite = torch.isfinite(cand)
    new_scores = (cand.masked_fill(~finite, 0.0).unsqueeze(1) * p).sum((-1, -2))
    alive = backpointers.sum(-1) > 0
    new_scores = new_scores.masked_fill(~alive, NEG_INF)
    # batched matrix-vector products (einsum would add permutes and reshapes, forward and backward)
    new_costs = torch.bmm(backpointers, costs.unsqueeze(-1)).squeeze(-1)
    if step_costs is not None:
        new_costs = new_costs + torch.bmm(outputs, step_costs.unsqueeze(-1)).squeeze(-1)
    joint = p.flatten(-2).argmax(-1)  # the MAP (beam, output) pair of each p_i
    vocab = cand.size(-1)
    return BeamStep(backpointers, outputs, new_scores, new_costs, joint // vocab, joint % vocab)


def hard_beam_step(beam_scores: Tensor, local_scores: Tensor, k: int, costs: Optional[Tensor] = None,
                   step_costs: Optional[Tensor] = None, augment: bool = False) -> BeamStep:
    """Algorithm 1, lines 5-7 (exact top-k), in ``BeamStep`` form (one-hot
    backpointers and outputs): the alpha -> inf limit of ``soft_beam_step``."""
    K, V = local_scores.shape[-2:]
    if costs is None:
        costs = torch.zeros_like(beam_scores)
    cand = candidate_scores(beam_scores, local_scores, step_costs, augment)
    top, index = cand.flatten(-2).topk(k, dim=-1)
    back, out = index // V, index % V
    backpointers = torch.nn.functional.one_hot(back, K).to(local_scores.dtype)
    outputs = torch.nn.functional.one_hot(out, V).to(local_scores.dtype)
    new_costs = costs.gather(1, back)
    if step_costs is not None:
        new_costs = new_costs + step_costs.gather(1, out)
    return BeamStep(backpointers, outputs, top, new_costs, back, out)


def soft_beam_loss(scores: Tensor, costs: Tensor, alpha: float) -> Tensor:
    """(B,) L = peaked-softmax_alpha(s_T) . D_T (line 19): the cost of the
    highest-scoring element, picked softly."""
    return (peaked_softmax(scores, alpha) * costs).sum(-1)


def soft_max_score(scores: Tensor, alpha: float) -> Tensor:
    """(B,) s_max = peaked-softmax_alpha(s_T) . s_T (section 4.4)."""
    return (peaked_softmax(scores, alpha) * scores.masked_fill(~torch.isfinite(scores), 0.0)).sum(-1)


def hamming_step_costs(gold: Tensor, vocab_size: int, weights: Optional[Tensor] = None,
                       ignore_index: Optional[int] = None) -> Tensor:
    """d_t(w) = c(w) [w != y*_t] for every step: (B, T, V) from gold labels (B, T).

    weights: (V,) c(w), the cost of predicting w wrongly (default 1; the thesis's
    NER setting doubles the cost of a wrong ``O``). Steps whose gold label is
    ``ignore_index`` (padding past the horizon) cost 0."""
    c = torch.ones(vocab_size, device=gold.device) if weights is None else weights.to(gold.device)
    costs = c.expand(*gold.shape, vocab_size).clone()
    costs.scatter_(-1, gold.unsqueeze(-1), 0.0)
    if ignore_index is not None:
        costs = costs.masked_fill(gold.eq(ignore_index).unsqueeze(-1), 0.0)
    return costs


def open_length_hamming_costs(gold: Tensor, steps: int, vocab_size: int, eos: int, pad: int,
                              weights: Optional[Tensor] = None) -> Tensor:
    """Step costs d_t(w) (B, steps, V) whose sum along any hypothesis ended by EOS
    is its Hamming distance to the reference over max(len(hyp), len(ref))
    positions, a position that one of the two lacks counting as an error.

    gold: (B, L) references (each ends with EOS, then ``pad``). For t < len(ref):
    d_t(w) = c(w) [w != y*_t]; past the reference every token costs c(w); EOS at
    t < len(ref) - 1 costs c(EOS) plus the len(ref) - 1 - t reference positions it
    leaves unmatched (cost 1 each); ``pad`` (what a finished hypothesis outputs)
    costs 0. c: ``weights`` (V,), keyed by the predicted token (default 1)."""
    B, L = gold.shape
    lengths = gold.ne(pad).sum(1, keepdim=True)  # (B, 1)
    t = torch.arange(steps, device=gold.device).view(1, steps)
    padded = gold.new_full((B, max(steps, L)), pad)
    padded[:, :L] = gold
    ref = padded[:, :steps].masked_fill(t >= lengths, pad)  # y*_t, pad past the reference
    c = torch.ones(vocab_size, device=gold.device) if weights is None else weights.to(gold.device)
    costs = c.expand(B, steps, vocab_size).clone()
    costs.scatter_(-1, ref.unsqueeze(-1), 0.0)  # w = y*_t costs 0 (pad's column is zeroed below anyway)
    costs[..., eos] += (lengths - 1 - t).clamp(min=0).to(costs.dtype)
    costs[..., pad] = 0.0
    return costs


def parse_label_weights(spec: str) -> Dict[str, float]:
    """Parse ``"O=2.0,B-PER=1.5"`` into ``{"O": 2.0, "B-PER": 1.5}``.

    Whitespace around items is ignored; an empty or blank spec gives ``{}``. The
    label is everything before the last ``=``. Raises ``ValueError`` for an item
    without ``=``, an empty label, a weight that is not a finite number >= 0,
    or a label given twice.
    """
    weights: Dict[str, float] = {}
    if not spec.strip():
        return weights
    for item in spec.split(","):
        item = item.strip()
        label, sep, value = item.rpartition("=")
        label = label.strip()
        if not sep:
            raise ValueError(
                f"label weight {item!r} in {spec!r} is not of the form LABEL=WEIGHT"
            )
        if not label:
            raise ValueError(f"label weight {item!r} in {spec!r} has an empty label")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(
                f"label weight {item!r} in {spec!r}: {value.strip()!r} is not a number"
            ) from None
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"label weight {item!r} in {spec!r}: weight must be finite and >= 0")
        if label in weights:
            raise ValueError(f"label {label!r} is given twice in {spec!r}")
        weights[label] = weight
    return weights
