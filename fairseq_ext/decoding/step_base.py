"""What the static-cache decoder steps (``transformer_step.TransformerStep``,
``lstm_step.LSTMStep``) share: the products of their weights (the model's own, or G
parameter sets stepped together: grouped weights, MGS's theta and its perturbations in
one decode), layer norm, attention and dropout on rows, the rows' reorders and the soft
beam's mixing of them. Under gradients a weight's or table's gradient is computed once
for every position of the decode (``core.collected_gradients``).
"""
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.core.collected_gradients import CollectedTable, CollectedWeight, Gathered, Pairs, Product


def attend(q: Tensor, keys_t: Tensor, values: Tensor, bias: Tensor, scale: float, dropout=None) -> Tensor:
    """softmax(scale q k^T + bias) v over (N*H) rows: q (N*H, 1, d), keys_t (N*H, d, S),
    values (N*H, S, d), bias (N*H, 1, S) (0, or -inf for a masked key); ``dropout`` (a
    module or None) on the attention probabilities."""
    probs = torch.softmax(torch.baddbmm(bias, q, keys_t, alpha=scale), dim=-1)
    return torch.bmm(apply_dropout(probs, dropout), values)


def apply_dropout(x: Tensor, module) -> Tensor:
    """The decoder's own dropout module on x (None: no dropout). Calling the module, not
    ``F.dropout``, keeps whatever its caller made of it (the soft beam's masks shared
    over a sentence's beam)."""
    return module(x) if module is not None else x


def affine(x: Tensor, wt: Tensor, b: Optional[Tensor], pairs: Optional[Pairs] = None) -> Tensor:
    """x W^T + b for (rows, C) x. Grouped weights (wt (G, C, C'), b (G, 1, C')): the rows
    are G equal blocks, block g multiplied by group g's weights. ``pairs``: (W^T, b) from
    ``CollectedWeight``, whose gradient is computed once for every position."""
    if pairs is not None:
        return Product.apply(x, wt, b, pairs)
    if wt.dim() == 2:
        y = torch.mm(x, wt)
        return y.add_(b) if b is not None else y
    x3 = x.view(wt.size(0), -1, x.size(-1))
    y = torch.baddbmm(b, x3, wt) if b is not None else torch.bmm(x3, wt)
    return y.view(-1, y.size(-1))


def norm_rows(x: Tensor, norm: Tuple) -> Tensor:
    """Layer norm of (rows, C) x; ``norm`` from ``TransformerStep._norm`` (grouped weights:
    (G, 1, C), block g of the rows scaled by group g's)."""
    shape, w, b, eps = norm
    if w is None or w.dim() == 1:
        return torch.native_layer_norm(x, shape, w, b, eps)[0]
    y = torch.native_layer_norm(x, shape, None, None, eps)[0].view(w.size(0), -1, x.size(-1))
    return torch.addcmul(b, y, w).view(x.shape)


class DecoderStep:
    """What the static-cache steps share: the weights of their products as ``affine``
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
        # under gradients, each weight's gradient once for all positions (``CollectedWeight``; not
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
        for G parameter sets) as ``affine`` multiplies: W^T contiguous, or (G, in, out) and
        (G, 1, out). Under gradients (differentiable step), (W^T, bias, pairs) whose gradient
        ``CollectedWeight`` computes once."""
        if self.groups > 1:
            return w.transpose(1, 2), (b[:, None] if b is not None else None)
        wt = w.t() if self.compiled else w.t().contiguous()  # compiled: the compiler lays the product out
        return self._collected(wt, b) if collect else (wt, b)

    def _collected(self, wt: Tensor, b: Optional[Tensor]) -> Tuple:
        """(W^T, b, pairs) under gradients (one parameter set), else (W^T, b) as they are."""
        if not self.collect or self.groups > 1:
            return wt, b
        pairs = Pairs()
        return (*CollectedWeight.apply(pairs, wt, b), pairs)

    def _table(self, table: Tensor) -> Tuple[Tensor, Optional[Pairs]]:
        """(table, pairs) for ``_rows``: under gradients the table's gradient is collected
        once for every position (``CollectedTable``), where it requires one."""
        if not (self.collect and table.requires_grad):
            return table, None
        pairs = Pairs()
        return CollectedTable.apply(pairs, table), pairs

    @staticmethod
    def _rows(table: Tuple[Tensor, Optional[Pairs]], index: Tensor) -> Tensor:
        """Rows ``index`` of a ``_table``."""
        t, pairs = table
        return t.index_select(0, index) if pairs is None else Gathered.apply(t, index, pairs)
