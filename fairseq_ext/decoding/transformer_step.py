"""One decoder step of fairseq's ``TransformerDecoder`` with static caches.

fairseq's incremental decoding runs a chain of small operators per token: its
key/value caches grow by concatenation, every layer reads and writes a dictionary of
buffers, and finished rows are removed by re-indexing every cache entry. On a GPU a
small model's step is launch-bound, so that chain is the cost of decoding.
``TransformerStep`` computes the same step from the model's own parameters (a
checkpoint needs no conversion): key/value caches preallocated for the whole decode
and written in place, the encoder's keys and values projected once, one fused
projection for the self-attention's queries, keys and values, matrix products on
pre-transposed weights, and finished rows masked by the caller, removed only
rarely (``reorder``: once at most half of the rows are still running). It serves
``transformer`` (encoder-decoder) and ``transformer_lm`` (decoder-only) models.

It follows fairseq's full teacher-forced forward, also where fairseq's own
incremental path does not: a ``<pad>`` in a history is masked as a key and skipped
when counting positions (fairseq's incremental path does neither).

Two variants: G parameter sets stepped together (grouped weights: MGS's theta and
its perturbations in one decode), and a differentiable step for decoding under
gradients (caches grown by concatenation, fairseq's dropout; DSS's exact pass, the
soft beam). Under gradients each weight's gradient is one product over every
position of the decode (``CollectedWeight``), not one product per position summed.

fairseq's ``LSTMDecoder`` (``lstm``, ``lstm_lm``) has its own step with the same
interface, ``lstm_step.LSTMStep``; both build on ``step_base``, and
``steps.decoder_step`` builds the one a model needs. ``transformer_unsupported_reason``
names what a decoder has that this step does not cover (another decoder class;
adaptive input or softmax, quantisation noise, cross-self-attention, NormFormer's
extra scalings, attention biases, forward hooks on its modules, LayerDrop in
training).
"""
import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.decoding.step_base import attend, DecoderStep, apply_dropout, norm_rows, affine


def transformer_unsupported_reason(decoder) -> Optional[str]:
    """Why ``TransformerStep`` cannot run ``decoder``, or None when it can."""
    try:
        from fairseq.models.transformer import TransformerDecoderBase
    except ImportError:  # pragma: no cover - fairseq without the Base classes
        return "this fairseq has no TransformerDecoderBase"
    if not isinstance(decoder, TransformerDecoderBase):
        return f"{type(decoder).__name__} is neither a fairseq TransformerDecoder nor an LSTMDecoder"
    if getattr(decoder, "adaptive_softmax", None) is not None:
        return "adaptive softmax"
    if not isinstance(decoder.embed_tokens, torch.nn.Embedding):
        return f"{type(decoder.embed_tokens).__name__} token embeddings (adaptive input)"
    if getattr(decoder, "quant_noise", None) is not None:
        return "quantisation noise"
    if getattr(decoder, "cross_self_attention", False):
        return "cross-self-attention"
    if decoder.embed_positions is None:
        return "no positional embeddings"
    if decoder.training and getattr(decoder, "decoder_layerdrop", 0) > 0:
        return "LayerDrop (the step runs every layer)"
    if any(m._forward_hooks or m._forward_pre_hooks for m in decoder.modules()):
        return "forward hooks on its modules (the step reads their parameters, not their calls)"
    for layer in decoder.layers:
        for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid"):
            if getattr(layer, name, None) is not None:
                return f"a layer with {name} (NormFormer scalings)"
        for attn in (layer.self_attn, layer.encoder_attn):
            if attn is not None and (attn.bias_k is not None or attn.add_zero_attn):
                return "attention with bias_k / add_zero_attn"
            if attn is not None and attn.scaling != attn.head_dim ** -0.5:
                return "attention scaled other than by 1 / sqrt(head_dim)"
    return None


class TransformerStep(DecoderStep):
    """Decoder steps of ``model`` for ``rows`` sequences of at most ``max_steps`` tokens.

    model: a fairseq ``transformer`` / ``transformer_lm`` model (see
        ``unsupported_reason``), in eval mode.
    encoder_out: fairseq's encoder output for the B inputs (None for a language model).
    expand: (rows,) input index of each row (the B inputs repeated for candidates).
    weights, groups: G parameter sets decoded together (MGS's theta and its perturbations):
        ``weights(p)`` is the (G, *p.shape) stack of decoder parameter p; the rows are G
        equal blocks, block g decoded with set g (its encoder output among ``encoder_out``'s
        inputs, as ``expand`` says). None: the model's own parameters.
    differentiable: steps that autograd differentiates (the caches grow by concatenation
        instead of being written in place), with the decoder's dropout modules where it is
        in train mode, called in the order and on the shapes of fairseq's incremental path
        (the same masks for the same random state). For decoding under gradients:
        scheduled sampling's left-to-right pass, the soft beam (``mix``).

    ``step(tokens)`` feeds (rows,) tokens at the next position and returns the next
    tokens' log-probabilities, (rows, V) float32; the first call feeds the BOS.
    ``reorder(index)`` reorders (keeps, repeats) the rows, ``mix(weights, sentences)``
    mixes them (the soft beam's soft backpointers).
    """

    def __init__(self, model, encoder_out: Optional[Dict[str, List[Tensor]]], expand: Tensor, max_steps: int,
                 weights: Optional[Callable[[Tensor], Tensor]] = None, groups: int = 1, differentiable: bool = False,
                 compiled: bool = False):
        decoder = model.decoder
        self.decoder, self.pad = decoder, decoder.padding_idx
        rows = expand.numel()
        device = expand.device
        layers = decoder.layers
        first = layers[0].self_attn
        h, d = self.heads, self.head_dim = first.num_heads, first.head_dim
        self.rows = rows
        self._sets(weights, groups, rows, differentiable, compiled)
        # the attention's 1 / sqrt(head_dim): under gradients folded into the query projections where
        # that is exact (a power of two: head_dim a power of 4, e.g. 64; an unscaled product
        # differentiates with fewer operators), else applied to the scores
        scale = d ** -0.5
        exact = math.frexp(scale)[0] == 0.5
        self.query_scale, self.scale = (scale, 1.0) if differentiable and exact else (1.0, scale)
        dtype = decoder.embed_tokens.weight.dtype
        self.t = 0
        # positions: row i of a table is position pad + i (row 0, for <pad> tokens, is zero); one
        # table per parameter set when the positions are learned
        probe = torch.full((1, max_steps), self.pad + 1, dtype=torch.long, device=device)
        learned = dict(decoder.embed_positions.named_parameters())
        tables = [decoder.embed_positions(probe)[0]] if groups == 1 or not learned else [
            torch.func.functional_call(decoder.embed_positions, {k: self.P(v)[g] for k, v in learned.items()},
                                       (probe,))[0] for g in range(groups)]
        positions = torch.cat([torch.cat([t.new_zeros(1, t.size(1)), t]) for t in tables]).to(dtype)
        self.positions = self._table(positions)
        # per row, where its set's rows start in the token embeddings and in the position tables
        self.offsets = None
        if groups > 1:
            group = torch.arange(rows, device=device) // (rows // groups)
            self.offsets = (group * decoder.embed_tokens.num_embeddings, group * (max_steps + 1) * (len(tables) > 1))
        self.count = torch.zeros(rows, dtype=torch.long, device=device)  # non-pad tokens fed so far
        # self-attention: keys and values of every layer and position, written in place; a <pad>
        # key is masked by -inf in the bias (per row, repeated over the heads)
        if differentiable:  # per layer (rows * heads, 2, steps so far, head_dim): keys, then values
            self.grown: List[Optional[Tensor]] = [None] * len(layers)
            self.self_bias = torch.zeros(rows * h, 1, 0, dtype=dtype, device=device)
        else:
            self.kv = torch.zeros(len(layers), 2, rows, h, max_steps, d, dtype=dtype, device=device)
            self.self_bias = torch.zeros(rows, h, 1, max_steps, dtype=dtype, device=device)
            self._cache_views()
        self.zeros = torch.zeros(rows, dtype=dtype, device=device)
        training = differentiable and decoder.training

        def drop(module):  # the dropout modules that draw (None: none drawn)
            return module if training and module.p > 0 else None
        self.drop_embed = drop(decoder.dropout_module)

        enc, self.enc_bias = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0].transpose(0, 1).index_select(0, expand)  # (rows, S, C)
            s_len = enc.size(1)
            self.enc_bias = torch.zeros(rows, h, 1, s_len, dtype=dtype, device=device)
            if len(encoder_out["encoder_padding_mask"]) > 0:
                pad_mask = encoder_out["encoder_padding_mask"][0].index_select(0, expand)
                self.enc_bias.masked_fill_(pad_mask[:, None, None, :], float("-inf"))
            self.enc_bias = self.enc_bias.view(rows * h, 1, s_len)
        self.layers, enc_kv = [], []
        for layer in layers:
            sa = layer.self_attn
            p = {"pre": layer.normalize_before, "sa_ln": self._norm(layer.self_attn_layer_norm),
                 **self._qkv(sa), "sa_out": self._t(sa.out_proj),
                 "ffn_ln": self._norm(layer.final_layer_norm), "fc1": self._t(layer.fc1), "fc2": self._t(layer.fc2),
                 "act": layer.activation_fn, "ea": None, "drop_sa": drop(sa.dropout_module),
                 "drop": drop(layer.dropout_module), "drop_act": drop(layer.activation_dropout_module)}
            ea = layer.encoder_attn
            if ea is not None and enc is not None:
                flat = enc.reshape(rows * s_len, -1)
                # projected once, so by autograd's own product (nothing to collect)
                enc_kv += [affine(flat, *self._t(proj, collect=False)).view(rows, s_len, h, d).transpose(1, 2)
                           for proj in (ea.k_proj, ea.v_proj)]
                p["ea"] = {"ln": self._norm(layer.encoder_attn_layer_norm),
                           "q": self._t(ea.q_proj, scale=self.query_scale),
                           "out": self._t(ea.out_proj), "drop": drop(ea.dropout_module)}
            self.layers.append(p)
        # the encoder's keys and values of every layer in one tensor (2 x layers, rows, heads, S,
        # head_dim): one index_select reorders them all
        self.enc_kv = torch.stack(enc_kv) if enc_kv else None
        self._encoder_views()
        self.project_in = self._t(decoder.project_in_dim) if decoder.project_in_dim is not None else None
        self.project_out = self._t(decoder.project_out_dim) if decoder.project_out_dim is not None else None
        self.output = self._t(decoder.output_projection)
        embed = decoder.embed_tokens
        self.embed = self._table(self.P(embed.weight).reshape(-1, embed.embedding_dim))
        self.layernorm_embedding = self._norm(decoder.layernorm_embedding)
        self.layer_norm = self._norm(decoder.layer_norm)


    def _qkv(self, attn) -> Dict[str, Tuple]:
        """The self-attention's projections in ``_t``'s form: ``qkv``, the query, key and
        value projections as one, its outputs ordered by head (head, query / key / value,
        head_dim), so that a head's query, and its key beside its value, are views of the
        product; the differentiable step: ``q``, the query's, and ``kv``, the key's and
        value's as one (head, key / value, head_dim) (views split by autograd would cost
        more operators in the backward than a second product)."""
        parts = [self._t(proj, collect=False, scale=scale)
                 for proj, scale in ((attn.q_proj, self.query_scale), (attn.k_proj, 1.0), (attn.v_proj, 1.0))]
        h, d = self.heads, self.head_dim

        def by_head(ts):  # (..., h * d) each -> (..., h * len(ts) * d)
            return torch.stack([t.view(*t.shape[:-1], h, d) for t in ts], -2).flatten(-3)

        def joined(parts):
            biases = [b for _, b in parts]
            return self._collected(by_head([w for w, _ in parts]),
                                   by_head(biases) if all(b is not None for b in biases) else None)
        if self.differentiable:
            return {"q": self._collected(*parts[0]), "kv": joined(parts[1:])}
        return {"qkv": joined(parts)}

    def _norm(self, ln) -> Optional[Tuple]:
        """(shape, weight, bias, eps) of a LayerNorm for ``norm_rows`` (None for no LayerNorm)."""
        if ln is None:
            return None
        w, b = ln.weight, ln.bias
        if self.groups > 1 and w is not None:
            w, b = self.P(w)[:, None], self.P(b)[:, None]
        return ln.normalized_shape, w, b, ln.eps

    def _encoder_views(self) -> None:
        """Per layer with encoder attention, the (rows * heads, head_dim, S) keys and (rows *
        heads, S, head_dim) values its products read: views of ``enc_kv`` (one autograd node)."""
        if self.enc_kv is None:
            return
        parts = self.enc_kv.flatten(1, 2).unbind(0)
        for j, ea in enumerate(p["ea"] for p in self.layers if p["ea"] is not None):
            ea["keys_t"], ea["values"] = parts[2 * j].transpose(1, 2), parts[2 * j + 1]

    def _cache_views(self) -> None:
        """Per layer, the (rows * heads, steps, head_dim) views of the keys and values the
        attention products read, and the bias's (rows * heads, 1, steps) view."""
        layers, _, rows, h, steps, d = self.kv.shape
        self.keys = [self.kv[i, 0].view(rows * h, steps, d) for i in range(layers)]
        self.values = [self.kv[i, 1].view(rows * h, steps, d) for i in range(layers)]
        self.self_bias_3d = self.self_bias.view(rows * h, 1, steps)

    def reorder(self, index: Tensor) -> None:
        """Row i becomes the old row ``index[i]``, in every per-row state: keeping some rows
        (a compaction, done rarely: each copies the caches, to stop computing rows that
        finished), repeating them (a beam's expansion) or following backpointers."""
        n_old, h, n = self.rows, self.heads, index.numel()
        self._reordered_rows(index)
        self.count, self.zeros = self.count.index_select(0, index), self.zeros.index_select(0, index)
        if self.offsets is not None:
            self.offsets = tuple(o.index_select(0, index) for o in self.offsets)

        def rows_of(t: Tensor) -> Tensor:  # (n_old * h, ...) -> (n * h, ...)
            return t.view(n_old, h, *t.shape[1:]).index_select(0, index).view(n * h, *t.shape[1:])
        if self.differentiable:
            self.self_bias = rows_of(self.self_bias)
            self.grown = [None if kv is None else rows_of(kv) for kv in self.grown]
        else:
            self.kv = self.kv.index_select(2, index)
            self.self_bias = self.self_bias.index_select(0, index)
            self._cache_views()
        if self.enc_bias is not None:
            self.enc_bias = rows_of(self.enc_bias)
        if self.enc_kv is not None:
            self.enc_kv = self.enc_kv.index_select(1, index)
            self._encoder_views()

    def mix(self, weights: Tensor, sentences: int) -> None:
        """The soft beam's reorder (differentiable step): the rows are ``sentences`` groups
        of K (the beams of a sentence); new row r is sum_j weights[r, j] x row j of r's
        sentence, weights (rows, K) row-stochastic. Every layer's self-attention keys and
        values are mixed by one batched product. The rest of the per-row state (the
        encoder's keys, values and padding; the positions and padding of the tokens fed)
        must be the same for a sentence's rows, as it is in a beam search (one source, the
        same number of tokens fed, none of them padding): it stays as it is."""
        self.grown = self._mixed(self.grown, weights, sentences)  # (rows * h, 2, t, d) each

    def _self_attention(self, i: int, x: Tensor, p: Dict) -> Tensor:
        n, h, d, t = self.rows, self.heads, self.head_dim, self.t
        if self.differentiable:  # the query, and each head's key beside its value (``_qkv``)
            q = affine(x, *p["q"]).view(n * h, 1, d)
            kv = affine(x, *p["kv"]).view(n * h, 2, 1, d)
            kv = self.grown[i] = kv if self.grown[i] is None else torch.cat([self.grown[i], kv], 2)
            keys, values = kv.unbind(1)  # one autograd node, where two slices would make two zero caches
            return attend(q, keys.transpose(1, 2), values, self.self_bias, self.scale, p["drop_sa"]).view(n, h * d)
        qkv = affine(x, *p["qkv"]).view(n, h, 3, d)  # per head its query, key and value (``_qkv``)
        q = qkv[:, :, 0].reshape(n * h, 1, d)  # a view: no copy
        self.kv[i, :, :, :, t] = qkv[:, :, 1:].permute(2, 0, 1, 3)
        keys_t = self.keys[i][:, : t + 1].transpose(1, 2)
        return attend(q, keys_t, self.values[i][:, : t + 1], self.self_bias_3d[..., : t + 1], self.scale).view(n, h * d)

    def _encoder_attention(self, x: Tensor, ea: Dict) -> Tensor:
        n = self.rows
        q = affine(x, *ea["q"]).view(n * self.heads, 1, self.head_dim)
        return attend(q, ea["keys_t"], ea["values"], self.enc_bias, self.scale, ea["drop"]).view(n, -1)

    def logits(self, tokens: Tensor, embeds: Optional[Tensor] = None, replace: Optional[Tensor] = None) -> Tensor:
        """Feed (rows,) tokens at the next position; (rows, V) output scores in the model's dtype.
        ``embeds`` (rows, E), ``replace`` (rows,) bool: where ``replace`` (every row where it is
        None), the row's token embedding (before any scaling) is ``embeds``' row instead (a
        soft input); the tokens still count as tokens (positions, padding)."""
        d = self.decoder
        nonpad = tokens.ne(self.pad)
        self.count += nonpad
        bias = self.zeros.masked_fill(~nonpad, float("-inf"))[:, None]
        if self.differentiable:
            column = bias.expand(self.rows, self.heads).reshape(-1, 1, 1)
            self.self_bias = torch.cat([self.self_bias, column], 2)
        else:
            self.self_bias[:, :, 0, self.t] = bias
        position = self.count * nonpad
        if self.offsets is not None:
            tokens, position = tokens + self.offsets[0], position + self.offsets[1]
        if embeds is not None and replace is None:
            x = embeds.to(self.embed[0].dtype)
        else:
            x = self._rows(self.embed, tokens)
            if replace is not None:
                x = torch.where(replace[:, None], embeds.to(x.dtype), x)
        if d.embed_scale != 1:
            x = x * d.embed_scale
        if self.project_in is not None:
            x = affine(x, *self.project_in)
        x = x + self._rows(self.positions, position)
        if self.layernorm_embedding is not None:
            x = norm_rows(x, self.layernorm_embedding)
        x = apply_dropout(x, self.drop_embed)
        for i, p in enumerate(self.layers):
            pre = p["pre"]
            residual = x
            x = norm_rows(x, p["sa_ln"]) if pre else x
            x = residual + apply_dropout(affine(self._self_attention(i, x, p), *p["sa_out"]), p["drop"])
            x = x if pre else norm_rows(x, p["sa_ln"])
            ea = p["ea"]
            if ea is not None:
                residual = x
                x = norm_rows(x, ea["ln"]) if pre else x
                x = residual + apply_dropout(affine(self._encoder_attention(x, ea), *ea["out"]), p["drop"])
                x = x if pre else norm_rows(x, ea["ln"])
            residual = x
            x = norm_rows(x, p["ffn_ln"]) if pre else x
            x = residual + apply_dropout(affine(apply_dropout(p["act"](affine(x, *p["fc1"])), p["drop_act"]), *p["fc2"]), p["drop"])
            x = x if pre else norm_rows(x, p["ffn_ln"])
        if self.layer_norm is not None:
            x = norm_rows(x, self.layer_norm)
        if self.project_out is not None:
            x = affine(x, *self.project_out)
        self.t += 1
        return affine(x, *self.output)
