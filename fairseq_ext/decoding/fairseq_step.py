"""fairseq's own incremental decoding behind the interface of the static-cache steps, so that
one loop per search serves both decoding paths (``steps.build_step`` chooses the object).

``FairseqStep`` runs the model's decoder as fairseq's ``SequenceGenerator`` does: the tokens
fed so far as ``prev_output_tokens``, the decoder's incremental state, the encoder output
reordered with the rows (``reorder_incremental_state_scripting``, ``reorder_encoder_out``).
A soft input replaces a row's token embedding through a forward hook on the decoder's
embedding (``soft_inputs.EmbeddingOverride``), and the soft beam's mixing of rows is
``soft_inputs.SoftReorder``. This is the reference path: any fairseq decoder with an
incremental state runs on it, and the static-cache steps are tested against it.
"""
from typing import Optional

import torch
from torch import Tensor

from fairseq_ext.decoding.soft_inputs import EmbeddingOverride, SoftReorder, decoder_embedding


class FairseqStep:
    """Decoder steps of a fairseq model on fairseq's incremental path for ``expand.numel()`` rows,
    row r decoding input ``expand[r]``; the methods of ``TransformerStep``.

    encoder_out: the encoder's output for the inputs (None for a decoder-only model).
    """

    def __init__(self, model, encoder_out, expand: Tensor):
        self.model, self.decoder = model, model.decoder
        self.encoder_out = encoder_out
        if encoder_out is not None and not torch.equal(expand, torch.arange(expand.numel(), device=expand.device)):
            self.encoder_out = model.encoder.reorder_encoder_out(encoder_out, expand)
        self.rows = expand.numel()
        self.state = {}
        self.fed: Optional[Tensor] = None  # (rows, t) the tokens fed so far
        self._soft_reorder: Optional[SoftReorder] = None

    def _forward(self, tokens: Tensor, embeds: Optional[Tensor], replace: Optional[Tensor]):
        self.fed = tokens[:, None] if self.fed is None else torch.cat([self.fed, tokens[:, None]], 1)
        kwargs = {"incremental_state": self.state}
        if self.encoder_out is not None:
            kwargs["encoder_out"] = self.encoder_out
        if embeds is None:
            return self.decoder(self.fed, **kwargs)
        mask = replace[:, None] if replace is not None else torch.ones_like(tokens, dtype=torch.bool)[:, None]
        with EmbeddingOverride(decoder_embedding(self.decoder)) as override:
            override.set(mask, embeds.unsqueeze(1))
            return self.decoder(self.fed, **kwargs)

    def logits(self, tokens: Tensor, embeds: Optional[Tensor] = None, replace: Optional[Tensor] = None) -> Tensor:
        """Feed (rows,) tokens at the next position (``embeds`` (rows, E) in place of their
        embeddings where ``replace`` (rows,), every row where it is None); (rows, V) output scores."""
        return self._forward(tokens, embeds, replace)[0][:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Feed (rows,) tokens; (rows, V) float32 log-probabilities (the model's
        ``get_normalized_probs``, as fairseq-generate scores)."""
        out = self._forward(tokens, None, None)
        return self.model.get_normalized_probs((out[0][:, -1:],) + tuple(out[1:]), log_probs=True).squeeze(1).float()

    def reorder(self, index: Tensor) -> None:
        """Row i becomes the old row ``index[i]``: the incremental state, the encoder output and
        the tokens fed."""
        self.decoder.reorder_incremental_state_scripting(self.state, index)
        if self.encoder_out is not None:
            self.encoder_out = self.model.encoder.reorder_encoder_out(self.encoder_out, index)
        if self.fed is not None:
            self.fed = self.fed.index_select(0, index)
        self.rows = index.numel()

    def mix(self, weights: Tensor, sentences: int) -> None:
        """The soft beam's reorder: row r of the incremental state becomes sum_j weights[r, j] x
        row j of r's sentence (``SoftReorder``); the encoder output, the same for a sentence's
        rows, stays."""
        if self._soft_reorder is None:
            self._soft_reorder = SoftReorder(self.decoder)
        self._soft_reorder(self.state, weights, sentences)
