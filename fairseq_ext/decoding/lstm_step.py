"""One decoder step of fairseq's ``LSTMDecoder`` from the model's own parameters.

fairseq's incremental LSTM step reads its states from a dictionary and stacks them back
every token, concatenates the input feed to the embedding, runs each layer's cell as
two products and a chain of gate operators, and attends by an elementwise product and
two sums over the source. ``LSTMStep`` computes the same step with the same interface
as ``TransformerStep``: per layer one product of the input, the input feed and the
hidden state with the stacked weights, the gates by one sigmoid and one tanh, the
attention by two batched products over the rows' source states. A checkpoint needs no
conversion. It serves fairseq's ``lstm`` (attention or not, input feeding, several
layers, residual connections, an encoder of another width) and ``lstm_lm``.

fairseq's LSTM has no positions and masks nothing in the history: its incremental path
and its full forward are the same function, and the step follows both (also with
``<pad>`` or ``<s>`` in a history). Dropout (train mode, the differentiable step) is
the decoder's own modules, called in fairseq's order on tensors of fairseq's sizes:
the same masks for the same random state.
"""
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.decoding.step_base import DecoderStep, apply_dropout, affine


def lstm_unsupported_reason(decoder) -> Optional[str]:
    """Why ``LSTMStep`` cannot run fairseq ``LSTMDecoder`` ``decoder``, or None when it can."""
    from fairseq.models.lstm import AttentionLayer, LSTMDecoder

    for name in ("forward", "extract_features", "output_layer"):
        if getattr(type(decoder), name) is not getattr(LSTMDecoder, name):
            return f"{type(decoder).__name__} overrides LSTMDecoder.{name}"
    if decoder.adaptive_softmax is not None:
        return "adaptive softmax"
    if not isinstance(decoder.embed_tokens, torch.nn.Embedding):
        return f"{type(decoder.embed_tokens).__name__} token embeddings"
    if any(type(cell) is not torch.nn.LSTMCell for cell in decoder.layers):
        return "a layer that is not torch's LSTMCell"
    if decoder.attention is not None and type(decoder.attention) is not AttentionLayer:
        return f"{type(decoder.attention).__name__} attention"
    if any(m._forward_hooks or m._forward_pre_hooks for m in decoder.modules()):
        return "forward hooks on its modules (the step reads their parameters, not their calls)"
    return None


class LSTMStep(DecoderStep):
    """Decoder steps of a fairseq ``lstm`` / ``lstm_lm`` model for ``rows`` sequences;
    the arguments and methods of ``TransformerStep`` (``max_steps`` is not needed: the
    state does not grow).

    encoder_out: fairseq's LSTM encoder output for the B inputs, (outputs, hiddens, cells,
        padding mask) (None for a language model).
    """

    def __init__(self, model, encoder_out: Optional[Tuple[Tensor, ...]], expand: Tensor, max_steps: int = 0,
                 weights: Optional[Callable[[Tensor], Tensor]] = None, groups: int = 1, differentiable: bool = False,
                 compiled: bool = False):
        decoder = self.decoder = model.decoder
        rows = self.rows = expand.numel()
        self._sets(weights, groups, rows, differentiable, compiled)
        device, dtype = expand.device, decoder.embed_tokens.weight.dtype
        training = differentiable and decoder.training
        self.drop_in = decoder.dropout_in_module if training and decoder.dropout_in_module.p > 0 else None
        self.drop_out = decoder.dropout_out_module if training and decoder.dropout_out_module.p > 0 else None
        n_layers, size = decoder.num_layers, decoder.hidden_size
        self.source = self.source_bias = self.feed = None
        if encoder_out is not None:
            outs, hiddens, cells, pad_mask = encoder_out[:4]
            self.source = outs.transpose(0, 1).index_select(0, expand)  # (rows, S, C)
            if pad_mask is not None:  # fairseq masks the padding in float32 whatever the model's dtype
                self.source_bias = torch.zeros(rows, outs.size(0), device=device).masked_fill_(
                    pad_mask.t().index_select(0, expand), float("-inf"))
            self.h = [hiddens[i].index_select(0, expand) for i in range(n_layers)]
            self.c = [cells[i].index_select(0, expand) for i in range(n_layers)]
            if decoder.encoder_hidden_proj is not None:
                self.h = [affine(h, *self._t(decoder.encoder_hidden_proj, collect=False)) for h in self.h]
                self.c = [affine(c, *self._t(decoder.encoder_cell_proj, collect=False)) for c in self.c]
            self.feed = torch.zeros(rows, size, dtype=dtype, device=device)  # fairseq's input feed
        else:
            self.h = [torch.zeros(rows, size, dtype=dtype, device=device) for _ in range(n_layers)]
            self.c = [torch.zeros_like(h) for h in self.h]
        # per layer one product: [input, hidden] times [W_ih, W_hh]^T, plus b_ih + b_hh
        self.cells = []
        for cell in decoder.layers:
            w = torch.cat([self.P(cell.weight_ih), self.P(cell.weight_hh)], dim=-1)
            b = self.P(cell.bias_ih) + self.P(cell.bias_hh) if cell.bias else None
            self.cells.append(self._linear(w, b))
        attention = decoder.attention
        self.attention = None if attention is None else (self._t(attention.input_proj),
                                                         self._t(attention.output_proj))
        self.additional_fc = self._t(decoder.additional_fc) if hasattr(decoder, "additional_fc") else None
        if decoder.share_input_output_embed:
            self.output = self._linear(self.P(decoder.embed_tokens.weight), None)
        else:
            self.output = self._t(decoder.fc_out)
        embed = decoder.embed_tokens
        self.embed = self._table(self.P(embed.weight).reshape(-1, embed.embedding_dim))
        self.offsets = None  # per row, where its set's rows start in the token embeddings
        if groups > 1:
            self.offsets = torch.arange(rows, device=device) // (rows // groups) * decoder.embed_tokens.num_embeddings

    def reorder(self, index: Tensor) -> None:
        """Row i becomes the old row ``index[i]``, in every per-row state."""
        self._reordered_rows(index)
        self.h = [h.index_select(0, index) for h in self.h]
        self.c = [c.index_select(0, index) for c in self.c]
        for name in ("feed", "source", "source_bias", "offsets"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))

    def mix(self, weights: Tensor, sentences: int) -> None:
        """The soft beam's reorder, as ``TransformerStep.mix``: every layer's hidden and cell
        states and the input feed mixed by one batched product; the source states (the same
        for a sentence's rows) stay as they are."""
        parts = self._mixed(self.h + self.c + ([self.feed] if self.feed is not None else []), weights, sentences)
        n = len(self.h)
        self.h, self.c = parts[:n], parts[n:2 * n]
        if self.feed is not None:
            self.feed = parts[2 * n]

    def logits(self, tokens: Tensor, embeds: Optional[Tensor] = None, replace: Optional[Tensor] = None) -> Tensor:
        """As ``TransformerStep.logits``: (rows,) tokens fed (``embeds`` in place of their
        embeddings where ``replace``, every row where it is None); (rows, V) output scores."""
        d = self.decoder
        if embeds is not None and replace is None:
            x = embeds.to(self.embed[0].dtype)
        else:
            x = self._rows(self.embed, tokens if self.offsets is None else tokens + self.offsets)
            if replace is not None:
                x = torch.where(replace[:, None], embeds.to(x.dtype), x)
        x = apply_dropout(x, self.drop_in)
        x = torch.cat([x, self.feed], 1) if self.feed is not None else x
        size = d.hidden_size
        for i, weights in enumerate(self.cells):
            gates = affine(torch.cat([x, self.h[i]], 1), *weights).view(-1, 4, size)
            s = torch.sigmoid(gates)  # input, forget, (cell: tanh below), output gates
            c = torch.addcmul(s[:, 1] * self.c[i], s[:, 0], torch.tanh(gates[:, 2]))
            h = s[:, 3] * torch.tanh(c)
            x = apply_dropout(h, self.drop_out)
            if d.residuals:
                x = x + self.h[i]
            self.h[i], self.c[i] = h, c
        out = h
        if self.attention is not None:
            proj_in, proj_out = self.attention
            query = affine(h, *proj_in)
            scores = torch.bmm(self.source, query.unsqueeze(2)).squeeze(2)
            if self.source_bias is not None:  # in float32 and back, as fairseq (its rounding, gradients included)
                scores = (scores.float() + self.source_bias).to(scores.dtype)
            probs = torch.softmax(scores, dim=-1)
            context = torch.bmm(probs.unsqueeze(1), self.source).squeeze(1)
            out = torch.tanh(affine(torch.cat([context, h], 1), *proj_out))
        out = apply_dropout(out, self.drop_out)
        if self.feed is not None:
            self.feed = out
        if self.additional_fc is not None:
            out = apply_dropout(affine(out, *self.additional_fc), self.drop_out)
        return affine(out, *self.output)
