"""Feed a fairseq decoder embeddings that are not rows of its embedding table
(soft decisions, mixtures), without changing the model.

The mechanism is a forward hook on the decoder's token embedding module
(``decoder.embed_tokens``: fairseq's ``transformer`` and ``lstm`` decoders and our
``tagging_lstm`` all have one): the decoder is called with ordinary token ids, and
the hook replaces the embedding lookup's output at chosen positions by given
vectors. Everything the decoder derives from the token ids (learned or sinusoidal
positions, padding masks, the incremental-state slicing to the last token) and
everything it applies after the lookup (``embed_scale``, ``project_in_dim``,
dropout, layer norms) is therefore exactly what it is for token inputs. The
encoder is run before the hook is armed, so a shared source / target embedding
(``--share-all-embeddings``) is not affected.

DSS's passes (``dss_passes``) and the soft beam search (``beam_search``) feed soft
inputs through it on fairseq's path; ``SoftReorder`` mixes the incremental state by
soft backpointers.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError

class EmbeddingOverride:
    """A forward hook on ``embedding`` that, while armed with ``set(mask, embeds)``,
    returns ``where(mask, embeds, lookup)``: mask (N, T) bool, embeds (N, T, E)
    matching the lookup's output (N, T, E). Use as a context manager; ``clear()``
    disarms it (lookups pass through)."""

    def __init__(self, embedding: nn.Module):
        self.embedding = embedding
        self.mask: Optional[Tensor] = None
        self.embeds: Optional[Tensor] = None
        self.calls = 0
        self._handle = None

    def __enter__(self) -> "EmbeddingOverride":
        self._handle = self.embedding.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()
        self.clear()

    def set(self, mask: Tensor, embeds: Tensor) -> None:
        self.mask, self.embeds = mask, embeds

    def clear(self) -> None:
        self.mask, self.embeds = None, None

    def _hook(self, module: nn.Module, inputs, output: Tensor) -> Tensor:
        self.calls += 1
        if self.mask is None:
            return output
        if output.shape[:-1] != self.mask.shape or output.shape != self.embeds.shape:
            raise RuntimeError(
                f"embedding override: the decoder looked up {tuple(output.shape)} embeddings, the override "
                f"has mask {tuple(self.mask.shape)} and embeddings {tuple(self.embeds.shape)}"
            )
        return torch.where(self.mask.unsqueeze(-1), self.embeds.to(output.dtype), output)


def decoder_embedding(decoder: nn.Module) -> nn.Embedding:
    """The decoder's input token embedding (``decoder.embed_tokens``), with a clear
    error for decoders that have none."""
    embedding = getattr(decoder, "embed_tokens", None)
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(
            f"{type(decoder).__name__} has no token embedding module 'embed_tokens' (nn.Embedding); soft "
            "inputs need one (fairseq's transformer and lstm decoders and tagging_lstm have it)"
        )
    return embedding


def check_plain_output_layer(decoder: nn.Module) -> None:
    if getattr(decoder, "adaptive_softmax", None) is not None:
        raise ConfigError("soft decisions need the decoder's full output scores: adaptive softmax is not supported")


def check_step_decodable(model: nn.Module, who: str) -> None:
    """Refuse, naming ``who`` (the option) and the model class, a model whose decoder
    cannot be run step by step with soft inputs: it needs an encoder, an incremental
    decoder (``reorder_incremental_state_scripting``), a token embedding ``embed_tokens`` and
    full output scores (no adaptive softmax)."""
    name = type(model).__name__
    decoder = getattr(model, "decoder", None)
    if getattr(model, "encoder", None) is None or decoder is None:
        raise ConfigError(f"{who} needs an encoder-decoder model (e.g. --arch transformer, lstm, tagging_lstm); "
                         f"got {name}")
    if not callable(getattr(decoder, "reorder_incremental_state_scripting", None)):
        raise ConfigError(f"{who} decodes step by step and needs an incremental decoder; {name}'s "
                         f"{type(decoder).__name__} has no reorder_incremental_state_scripting")
    decoder_embedding(decoder)
    check_plain_output_layer(decoder)


def _copy_state(state: Dict) -> Dict:
    """Shallow copy, one level down too (fairseq's reorders mutate the inner dicts)."""
    return {key: (dict(value) if isinstance(value, dict) else value) for key, value in state.items()}


def _leaves(state: Dict) -> Dict[Tuple[str, Optional[str]], Tensor]:
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update({(key, sub): t for sub, t in value.items() if isinstance(t, Tensor)})
        elif isinstance(value, Tensor):
            out[(key, None)] = value
    return out


class SoftReorder:
    """A soft generalisation of fairseq's incremental-state reorder: row r of the
    new state is sum_j M[r, j] x (beam j of r's sentence), M a (B*k, K) row-
    stochastic matrix (soft backpointers), instead of an index per row.

    Model-agnostic and vectorised. Which entries the decoder reorders, and along
    which dimension, is found once per entry by a probe: the decoder's
    ``reorder_incremental_state_scripting`` (what fairseq's SequenceGenerator calls: it
    reorders the decoder's and every submodule's cache; the transformer decoder's own
    ``reorder_incremental_state`` is a no-op, its caches live in the attention
    modules) with a reversing permutation, matched against ``index_select`` (the
    transformer keeps the batch in dim 0, fairseq's LSTM its stacked layer states in
    dim 1). Entries it leaves untouched (fairseq's encoder-decoder attention cache,
    identical for the beams of a sentence) stay untouched; non-float entries (padding
    masks) take the hard reorder (the argmax of M, B*k rows, exactly as in beam
    search); all float entries are mixed by one batched product M_b @ (the K beams
    of sentence b, every entry's values side by side), computed from the entries as
    they were (nothing is gathered K-fold, and the backward pass keeps only the
    entries and M): a constant number of operators per step, whatever the number of
    layers. With a one-hot M it equals the hard reorder exactly (tested)."""

    def __init__(self, decoder):
        self.decoder = decoder
        self._batch_dims: Dict[Tuple[str, Optional[str]], Optional[int]] = {}  # None: not reordered

    def __call__(self, state: Dict, mix: Tensor, num_sentences: int) -> None:
        """mix: (B*k, K) weights of the K beams of the row's sentence (rows grouped
        by sentence, beam-minor, as fairseq lays out beams; B*K rows in the state).
        Updates ``state``."""
        if not state:
            return
        rows, K = mix.shape
        B = num_sentences
        old = _leaves(state)
        if any(name not in self._batch_dims for name in old):
            self._find_batch_dims(_copy_state(state), old, B * K, mix.device)
        new, mixed, hard = {}, {}, None
        for name, tensor in old.items():
            dim = self._batch_dims[name]
            if dim is None:
                continue  # not reordered by the decoder: leave it
            if tensor.is_floating_point():
                mixed.setdefault(tensor.dtype, []).append(name)
                continue
            if hard is None:
                hard = torch.arange(B, device=mix.device).repeat_interleave(rows // B) * K + mix.argmax(-1)
            new[name] = tensor.index_select(dim, hard)
        for dtype, names in mixed.items():
            xs = [old[name].movedim(self._batch_dims[name], 0) for name in names]  # (B*K, ...) each
            together = torch.cat([x.reshape(B, K, -1) for x in xs], dim=2) if len(xs) > 1 else xs[0].reshape(B, K, -1)
            out = torch.bmm(mix.view(B, rows // B, K).to(dtype), together)
            for name, x, part in zip(names, xs, out.split([x[0].numel() for x in xs], dim=2)):
                new[name] = part.reshape(rows, *x.shape[1:]).movedim(0, self._batch_dims[name]).contiguous()
        for key in {key for key, sub in new if sub is not None}:
            state[key] = dict(state[key])  # new inner dicts: a holder of the old ones keeps them as they were
        for (key, sub), tensor in new.items():
            if sub is None:
                state[key] = tensor
            else:
                state[key][sub] = tensor

    def _find_batch_dims(self, snapshot: Dict, old: Dict, rows: int, device) -> None:
        """Batch dimension of each new entry of ``old`` (the leaves of ``snapshot``),
        or None for entries the decoder does not reorder."""
        probe = _copy_state(snapshot)
        order = torch.arange(rows - 1, -1, -1, device=device)
        self.decoder.reorder_incremental_state_scripting(probe, order)
        for name, after in _leaves(probe).items():
            before = old.get(name)
            if before is None or name in self._batch_dims:
                continue
            if after is before:
                self._batch_dims[name] = None
                continue
            dims = [d for d in range(before.dim()) if before.size(d) == rows and after.size(d) == rows
                    and torch.equal(before.index_select(d, order), after)]
            if not dims:
                raise RuntimeError(f"soft reorder: cannot find the batch dimension of incremental state {name}")
            self._batch_dims[name] = dims[0]
