"""Tensor pieces of the fixed-attention tagger (Goyal thesis 4.5 and 5.4.2),
shared by the model and by decoders that run its recurrence themselves (soft
beam search, differentiable scheduled sampling).

A sentence of n words is the source ``w_1 .. w_n <eos>`` (length n + 1) and the
target ``y_1 .. y_n <eos>`` (length n + 1): decoder step t (0-based) predicts
label t from the previous label and encoder state t ("fixed attention": the
context is the i-th encoder state, no attention weights), and step n predicts
``<eos>`` from the encoder state of the source ``<eos>``.

Forced length: at steps t < n only labels are possible, at step t >= n only
``<eos>``, so every decoder (greedy, beam, sampling, relaxations) outputs exactly
n labels. Masked log-probabilities are -inf (exactly impossible; fairseq's
``SequenceGenerator`` never finalizes a -inf hypothesis); code that needs finite
values clamps them.
"""
import torch
from torch import Tensor


def fixed_attention(encoder_states: Tensor, start: int, num_steps: int) -> Tensor:
    """Context vectors c_t = h^enc_t for decoder steps ``start .. start + num_steps - 1``.

    encoder_states: (B, S, C), right-aligned (position t holds source token t),
        zero at padding.
    Returns (B, num_steps, C); steps at or beyond S get zero vectors.
    """
    bsz, src_len, dim = encoder_states.shape
    ctx = encoder_states[:, start : start + num_steps]
    missing = num_steps - ctx.size(1)
    if missing > 0:
        ctx = torch.cat([ctx, encoder_states.new_zeros(bsz, missing, dim)], dim=1)
    return ctx


def forced_length_mask(start: int, num_steps: int, lengths: Tensor, is_label: Tensor, eos: int) -> Tensor:
    """Which outputs are allowed at decoder steps ``start .. start + num_steps - 1``.

    lengths: (B,) source lengths n + 1 (``<eos>`` included), i.e. the number of
        decoder steps of each row.
    is_label: (V,) bool, True for the label symbols of the target dictionary.
    Returns (B, num_steps, V) bool: labels where t < n, only ``eos`` where t >= n.
    """
    steps = torch.arange(start, start + num_steps, device=lengths.device)
    labels_phase = steps.unsqueeze(0) < (lengths.unsqueeze(1) - 1)  # (B, T)
    eos_only = torch.zeros_like(is_label)
    eos_only[eos] = True
    return torch.where(labels_phase.unsqueeze(-1), is_label.view(1, 1, -1), eos_only.view(1, 1, -1))


def force_length(logits: Tensor, start: int, lengths: Tensor, is_label: Tensor, eos: int) -> Tensor:
    """``logits`` (B, T, V) for steps ``start .. start + T - 1`` with the outputs
    that ``forced_length_mask`` forbids set to -inf."""
    allowed = forced_length_mask(start, logits.size(1), lengths, is_label, eos)
    return logits.masked_fill(~allowed, float("-inf"))
