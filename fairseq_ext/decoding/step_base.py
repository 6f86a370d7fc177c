"""What the static-cache decoder steps (``transformer_step.TransformerStep``,
``lstm_step.LSTMStep``) share: the products of their weights (the model's own, or G
parameter sets stepped together: grouped weights, MGS's theta and its perturbations in
one decode), layer norm, attention and dropout on rows, the rows' reorders and the soft
beam's mixing of them.

Under gradients (the differentiable step: DSS's exact pass, the soft beam) each weight's
gradient is one product over every position of the decode (``_CollectedWeight``), not
one product per position summed; a table's (token and position embeddings) one
index_add (``_CollectedTable``).
"""
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor


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
              differentiable: bool, compiled: bool = False) -> None:
        self.groups, self.P = groups, (weights if groups > 1 else (lambda p: p))
        if rows % groups:
            raise ValueError(f"{rows} rows are not {groups} equal blocks")
        if compiled and not differentiable:
            raise ValueError("only the differentiable step is compiled")
        self.differentiable, self.compiled = differentiable, compiled
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
