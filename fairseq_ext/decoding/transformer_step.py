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
position of the decode (``_CollectedWeight``), not one product per position summed.

fairseq's ``LSTMDecoder`` (``lstm``, ``lstm_lm``) has its own step with the same
interface, ``lstm_step.LSTMStep``; ``decoder_step`` builds the one a model needs.
``unsupported_reason(decoder)`` names what a decoder has that the steps do not
cover (another decoder class; adaptive input or softmax, quantisation noise,
cross-self-attention, NormFormer's extra scalings, attention biases, forward hooks
on its modules, LayerDrop in training); ``use_step(decoder, who)`` says so once in
the log, and callers then use fairseq's path.
"""
import logging
import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

logger = logging.getLogger(__name__)
_FALLBACK_LOGGED = set()


def _attend(q: Tensor, keys_t: Tensor, values: Tensor, bias: Tensor, scale: float, dropout=None) -> Tensor:
    """softmax(scale q k^T + bias) v over (N*H) rows: q (N*H, 1, d), keys_t (N*H, d, S),
    values (N*H, S, d), bias (N*H, 1, S) (0, or -inf for a masked key); ``dropout`` (a
    module or None) on the attention probabilities."""
    probs = torch.softmax(torch.baddbmm(bias, q, keys_t, alpha=scale), dim=-1)
    return torch.bmm(_dropout(probs, dropout), values)


def _dropout(x: Tensor, module) -> Tensor:
    """The decoder's own dropout module on x (None: no dropout). Calling the module, not
    ``F.dropout``, keeps whatever its caller made of it (the soft beam's masks shared
    over a sentence's beam)."""
    return module(x) if module is not None else x


def _is_lstm(decoder) -> bool:
    from fairseq.models.lstm import LSTMDecoder
    return isinstance(decoder, LSTMDecoder)


def unsupported_reason(decoder) -> Optional[str]:
    """Why no static-cache step (``TransformerStep``, ``lstm_step.LSTMStep``) can run
    ``decoder``, or None when one can."""
    if _is_lstm(decoder):
        from fairseq_ext.decoding.lstm_step import lstm_unsupported_reason
        return lstm_unsupported_reason(decoder)
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


def use_step(decoder, who: str) -> bool:
    """Whether a static-cache step can run ``decoder``; when none can, one log line (per
    caller and decoder type) says that ``who`` takes fairseq's incremental path and why."""
    reason = unsupported_reason(decoder)
    if reason is not None and (who, type(decoder)) not in _FALLBACK_LOGGED:
        _FALLBACK_LOGGED.add((who, type(decoder)))
        logger.info(f"{who}: fairseq's incremental path for {type(decoder).__name__} (the static-cache steps "
                    f"cover fairseq's TransformerDecoder and LSTMDecoder: {reason})")
    return reason is None


def decoder_step(model, encoder_out, expand: Tensor, max_steps: int,
                 weights: Optional[Callable[[Tensor], Tensor]] = None, groups: int = 1,
                 differentiable: bool = False, capturable: bool = False, compiled: bool = False) -> "_DecoderStep":
    """The static-cache step of ``model``'s decoder (``unsupported_reason`` None):
    ``TransformerStep``, or ``lstm_step.LSTMStep`` for fairseq's LSTMDecoder; the
    arguments are ``TransformerStep``'s. compiled: a differentiable step built for
    ``compiled_step.compiled_logits`` (its weights not collected)."""
    if _is_lstm(model.decoder):
        from fairseq_ext.decoding.lstm_step import LSTMStep
        cls = LSTMStep
    else:
        cls = TransformerStep
    return cls(model, encoder_out, expand, max_steps, weights, groups, differentiable, capturable, compiled)


class _Pairs:
    """The (input, output gradient) pairs of one weight's products in a decode, kept by
    their backward passes (``_Product``) for the weight's gradient (``_CollectedWeight``);
    ``w``: W (a view of W^T), which every product's input gradient multiplies by."""

    def __init__(self):
        self.inputs: List[Tensor] = []
        self.grads: List[Tensor] = []
        self.w: Optional[Tensor] = None


class _CollectedWeight(torch.autograd.Function):
    """(W^T, b) as they are, for products made once per position of a decode; their
    gradient is computed once, X^T G over the pairs every position's backward kept,
    instead of one product per position and the sum of them. Autograd runs this
    backward after every product's (it consumes their outputs)."""

    @staticmethod
    def forward(ctx, pairs: _Pairs, wt: Tensor, b: Optional[Tensor]):
        ctx.set_materialize_grads(False)
        ctx.pairs, ctx.dtypes = pairs, (wt.dtype, None if b is None else b.dtype)
        pairs.w = wt.t()
        return wt.view_as(wt), (None if b is None else b.view_as(b))

    @staticmethod
    def backward(ctx, grad_wt: Optional[Tensor], grad_b: Optional[Tensor]):
        pairs = ctx.pairs
        if pairs.grads:
            g = torch.cat(pairs.grads)
            x = torch.cat(pairs.inputs)
            pairs.inputs, pairs.grads = [], []
            summed = x.to(g.dtype).t().mm(g).to(ctx.dtypes[0])
            grad_wt = summed if grad_wt is None else grad_wt + summed
            if ctx.dtypes[1] is not None:
                summed = g.sum(0).to(ctx.dtypes[1])
                grad_b = summed if grad_b is None else grad_b + summed
        return None, grad_wt, grad_b


class _Product(torch.autograd.Function):
    """x W^T + b of ``_CollectedWeight``'s (W^T, b): its backward gives x's gradient and
    keeps (x, output gradient) for the weight's."""

    @staticmethod
    def forward(ctx, x: Tensor, wt: Tensor, b: Optional[Tensor], pairs: _Pairs) -> Tensor:
        ctx.save_for_backward(x)
        ctx.pairs = pairs
        return torch.mm(x, wt) if b is None else torch.addmm(b, x, wt)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, = ctx.saved_tensors
        pairs = ctx.pairs
        pairs.inputs.append(x)
        pairs.grads.append(grad)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.mm(pairs.w if pairs.w.dtype == grad.dtype else pairs.w.to(grad.dtype))
            grad_x = grad_x if grad_x.dtype == x.dtype else grad_x.to(x.dtype)
        return grad_x, None, None, None


class _CollectedTable(torch.autograd.Function):
    """A table (token or position embeddings) as it is, for rows gathered once per position
    of a decode (``_Gathered``); its gradient is one index_add of every position's rows'
    gradients, not a table-sized gradient per position and their sum."""

    @staticmethod
    def forward(ctx, pairs: _Pairs, table: Tensor):
        ctx.set_materialize_grads(False)
        ctx.pairs, ctx.shape, ctx.dtype = pairs, table.shape, table.dtype
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad_table: Optional[Tensor]):
        pairs = ctx.pairs
        if pairs.grads:
            g = torch.cat(pairs.grads)
            summed = g.new_zeros(ctx.shape).index_add_(0, torch.cat(pairs.inputs), g).to(ctx.dtype)
            pairs.inputs, pairs.grads = [], []
            grad_table = summed if grad_table is None else grad_table + summed
        return None, grad_table


class _Gathered(torch.autograd.Function):
    """Rows ``index`` of ``_CollectedTable``'s table: its backward keeps (index, gradient)."""

    @staticmethod
    def forward(ctx, table: Tensor, index: Tensor, pairs: _Pairs) -> Tensor:
        ctx.save_for_backward(index)
        ctx.pairs = pairs
        return table.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, = ctx.saved_tensors
        ctx.pairs.inputs.append(index)
        ctx.pairs.grads.append(grad)
        return None, None, None


def _mm(x: Tensor, wt: Tensor, b: Optional[Tensor], pairs: Optional[_Pairs] = None) -> Tensor:
    """x W^T + b for (rows, C) x. Grouped weights (wt (G, C, C'), b (G, 1, C')): the rows
    are G equal blocks, block g multiplied by group g's weights. ``pairs``: (W^T, b) from
    ``_CollectedWeight``, whose gradient is computed once for every position."""
    if pairs is not None:
        return _Product.apply(x, wt, b, pairs)
    if wt.dim() == 2:
        y = torch.mm(x, wt)
        return y.add_(b) if b is not None else y
    x3 = x.view(wt.size(0), -1, x.size(-1))
    y = torch.baddbmm(b, x3, wt) if b is not None else torch.bmm(x3, wt)
    return y.view(-1, y.size(-1))


def _ln(x: Tensor, norm: Tuple) -> Tensor:
    """Layer norm of (rows, C) x; ``norm`` from ``TransformerStep._norm`` (grouped weights:
    (G, 1, C), block g of the rows scaled by group g's)."""
    shape, w, b, eps = norm
    if w is None or w.dim() == 1:
        return torch.native_layer_norm(x, shape, w, b, eps)[0]
    y = torch.native_layer_norm(x, shape, None, None, eps)[0].view(w.size(0), -1, x.size(-1))
    return torch.addcmul(b, y, w).view(x.shape)


class _DecoderStep:
    """What the static-cache steps share: the weights of their products as ``_mm``
    multiplies them (the model's own, or G parameter sets stepped together, ``weights(p)``
    the (G, *p.shape) stack of parameter p's values; collected under gradients), and
    ``step``, the log-probabilities of ``logits``."""

    def step(self, tokens: Tensor) -> Tensor:
        """Feed (rows,) tokens at the next position; (rows, V) float32 log-probabilities."""
        return torch.log_softmax(self.logits(tokens).float(), dim=-1)

    def _sets(self, weights: Optional[Callable[[Tensor], Tensor]], groups: int, rows: int,
              differentiable: bool, capturable: bool = False, compiled: bool = False) -> None:
        self.groups, self.P = groups, (weights if groups > 1 else (lambda p: p))
        if rows % groups:
            raise ValueError(f"{rows} rows are not {groups} equal blocks")
        if differentiable and capturable:
            raise ValueError("a differentiable step is not capturable (its caches grow)")
        if compiled and not differentiable:
            raise ValueError("only the differentiable step is compiled")
        self.differentiable, self.capturable, self.compiled = differentiable, capturable, compiled
        # under gradients, each weight's gradient once for all positions (``_CollectedWeight``; not
        # in a compiled step, whose compiler cannot trace the Python lists it keeps)
        self.collect = differentiable and torch.is_grad_enabled() and not compiled

    def _reordered_rows(self, index: Tensor) -> None:
        """``reorder``'s new row count, which must keep the parameter sets' equal blocks."""
        if index.numel() % self.groups:
            raise ValueError(f"{index.numel()} rows break the {self.groups} equal blocks of the parameter sets")
        self.rows = index.numel()

    def _mixed(self, states: List[Tensor], weights: Tensor, sentences: int) -> List[Tensor]:
        """``mix`` of per-row states, each laid out rows first (its first dimension the rows,
        or the rows times a factor, row-major): row r of the result is sum_j weights[r, j]
        x row j of r's sentence; all states in one batched product."""
        if not self.differentiable:
            raise ValueError("mixing rows needs the differentiable step")
        rows, K = weights.shape
        if rows != self.rows or rows != sentences * K:
            raise ValueError(f"mixing {self.rows} rows: weights {tuple(weights.shape)} for {sentences} sentences")
        together = torch.cat([state.view(sentences, K, -1) for state in states], 2)
        mixed = torch.bmm(weights.view(sentences, K, K).to(together.dtype), together)
        return [part.reshape(state.shape)
                for part, state in zip(mixed.split([state.numel() // rows for state in states], 2), states)]

    def _t(self, linear, collect: bool = True, scale: float = 1.0) -> Tuple:
        """``_linear`` of an nn.Linear's weight and bias (both times ``scale``)."""
        w, b = self.P(linear.weight), getattr(linear, "bias", None)
        b = self.P(b) if b is not None else None
        if scale != 1.0:
            w, b = w * scale, (b * scale if b is not None else None)
        return self._linear(w, b, collect)

    def _linear(self, w: Tensor, b: Optional[Tensor], collect: bool = True) -> Tuple:
        """(W^T, bias) of a weight (out, in) and bias (out,) (stacks (G, out, in), (G, out)
        for G parameter sets) as ``_mm`` multiplies: W^T contiguous, or (G, in, out) and
        (G, 1, out). Under gradients (differentiable step), (W^T, bias, pairs) whose gradient
        ``_CollectedWeight`` computes once."""
        if self.groups > 1:
            return w.transpose(1, 2), (b[:, None] if b is not None else None)
        wt = w.t() if self.compiled else w.t().contiguous()  # compiled: the compiler lays the product out
        return self._collected(wt, b) if collect else (wt, b)

    def _collected(self, wt: Tensor, b: Optional[Tensor]) -> Tuple:
        """(W^T, b, pairs) under gradients (one parameter set), else (W^T, b) as they are."""
        if not self.collect or self.groups > 1:
            return wt, b
        pairs = _Pairs()
        return (*_CollectedWeight.apply(pairs, wt, b), pairs)

    def _table(self, table: Tensor) -> Tuple[Tensor, Optional[_Pairs]]:
        """(table, pairs) for ``_rows``: under gradients the table's gradient is collected
        once for every position (``_CollectedTable``), where it requires one."""
        if not (self.collect and table.requires_grad):
            return table, None
        pairs = _Pairs()
        return _CollectedTable.apply(pairs, table), pairs

    @staticmethod
    def _rows(table: Tuple[Tensor, Optional[_Pairs]], index: Tensor) -> Tensor:
        """Rows ``index`` of a ``_table``."""
        t, pairs = table
        return t.index_select(0, index) if pairs is None else _Gathered.apply(t, index, pairs)


class TransformerStep(_DecoderStep):
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
    capturable: every ``step`` runs the same kernels on the same memory, whatever the
        position (a CUDA graph of one step replays every later one: ``graphed_step``):
        the position a tensor, the caches written by ``index_copy_``, the attention over
        all ``max_steps`` positions with the ones not yet fed masked; between two
        ``reorder`` calls no state tensor is replaced. ``state()``: those tensors.

    ``step(tokens)`` feeds (rows,) tokens at the next position and returns the next
    tokens' log-probabilities, (rows, V) float32; the first call feeds the BOS.
    ``reorder(index)`` reorders (keeps, repeats) the rows, ``mix(weights, sentences)``
    mixes them (the soft beam's soft backpointers).
    """

    def __init__(self, model, encoder_out: Optional[Dict[str, List[Tensor]]], expand: Tensor, max_steps: int,
                 weights: Optional[Callable[[Tensor], Tensor]] = None, groups: int = 1, differentiable: bool = False,
                 capturable: bool = False, compiled: bool = False):
        decoder = model.decoder
        self.decoder, self.pad = decoder, decoder.padding_idx
        rows = expand.numel()
        device = expand.device
        layers = decoder.layers
        first = layers[0].self_attn
        h, d = self.heads, self.head_dim = first.num_heads, first.head_dim
        self.rows = rows
        self._sets(weights, groups, rows, differentiable, capturable, compiled)
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
            # capturable: every position's key masked until it is fed; the position a tensor
            self.self_bias = torch.full((rows, h, 1, max_steps), float("-inf") if capturable else 0.0,
                                        dtype=dtype, device=device)
            self.position = torch.zeros(1, dtype=torch.long, device=device) if capturable else None
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
                enc_kv += [_mm(flat, *self._t(proj, collect=False)).view(rows, s_len, h, d).transpose(1, 2)
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
        """(shape, weight, bias, eps) of a LayerNorm for ``_ln`` (None for no LayerNorm)."""
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

    def state(self) -> List[Tensor]:
        """The tensors a (capturable) step updates in place: caches, masks, positions."""
        return [self.kv, self.self_bias, self.count, self.position]

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
            q = _mm(x, *p["q"]).view(n * h, 1, d)
            kv = _mm(x, *p["kv"]).view(n * h, 2, 1, d)
            kv = self.grown[i] = kv if self.grown[i] is None else torch.cat([self.grown[i], kv], 2)
            keys, values = kv.unbind(1)  # one autograd node, where two slices would make two zero caches
            return _attend(q, keys.transpose(1, 2), values, self.self_bias, self.scale, p["drop_sa"]).view(n, h * d)
        qkv = _mm(x, *p["qkv"]).view(n, h, 3, d)  # per head its query, key and value (``_qkv``)
        q = qkv[:, :, 0].reshape(n * h, 1, d)  # a view: no copy
        if self.capturable:  # every position's keys and values, those not yet fed masked
            self.kv[i].index_copy_(3, self.position, qkv[:, :, 1:].permute(2, 0, 1, 3).unsqueeze(3))
            return _attend(q, self.keys[i].transpose(1, 2), self.values[i], self.self_bias_3d, self.scale).view(n, h * d)
        self.kv[i, :, :, :, t] = qkv[:, :, 1:].permute(2, 0, 1, 3)
        keys_t = self.keys[i][:, : t + 1].transpose(1, 2)
        return _attend(q, keys_t, self.values[i][:, : t + 1], self.self_bias_3d[..., : t + 1], self.scale).view(n, h * d)

    def _encoder_attention(self, x: Tensor, ea: Dict) -> Tensor:
        n = self.rows
        q = _mm(x, *ea["q"]).view(n * self.heads, 1, self.head_dim)
        return _attend(q, ea["keys_t"], ea["values"], self.enc_bias, self.scale, ea["drop"]).view(n, -1)

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
        elif self.capturable:
            self.self_bias.index_copy_(3, self.position, bias[:, :, None, None].expand(self.rows, self.heads, 1, 1))
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
            x = _mm(x, *self.project_in)
        x = x + self._rows(self.positions, position)
        if self.layernorm_embedding is not None:
            x = _ln(x, self.layernorm_embedding)
        x = _dropout(x, self.drop_embed)
        for i, p in enumerate(self.layers):
            pre = p["pre"]
            residual = x
            x = _ln(x, p["sa_ln"]) if pre else x
            x = residual + _dropout(_mm(self._self_attention(i, x, p), *p["sa_out"]), p["drop"])
            x = x if pre else _ln(x, p["sa_ln"])
            ea = p["ea"]
            if ea is not None:
                residual = x
                x = _ln(x, ea["ln"]) if pre else x
                x = residual + _dropout(_mm(self._encoder_attention(x, ea), *ea["out"]), p["drop"])
                x = x if pre else _ln(x, ea["ln"])
            residual = x
            x = _ln(x, p["ffn_ln"]) if pre else x
            x = residual + _dropout(_mm(_dropout(p["act"](_mm(x, *p["fc1"])), p["drop_act"]), *p["fc2"]), p["drop"])
            x = x if pre else _ln(x, p["ffn_ln"])
        if self.layer_norm is not None:
            x = _ln(x, self.layer_norm)
        if self.project_out is not None:
            x = _mm(x, *self.project_out)
        if self.capturable:
            self.position += 1
        else:
            self.t += 1
        return _mm(x, *self.output)
