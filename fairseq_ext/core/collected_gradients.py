"""Products and row gathers made once per position of a decode under gradients, whose
weight's (or table's) gradient autograd computes once for all positions: X^T G over the
(input, output gradient) pairs every position's backward kept (``CollectedWeight``,
``Product``), one index_add of every position's rows' gradients (``CollectedTable``,
``Gathered``), instead of one product (one table-sized gradient) per position and their
sum. Pure PyTorch; the static-cache decoder steps (``decoding.step_base``) use them for
the steps decoded under gradients (DSS's exact pass, the soft beam).
"""
from typing import List, Optional

import torch
from torch import Tensor


class Pairs:
    """The (input, output gradient) pairs of one weight's products in a decode, kept by
    their backward passes (``Product``) for the weight's gradient (``CollectedWeight``);
    ``w``: W (a view of W^T), which every product's input gradient multiplies by."""

    def __init__(self):
        self.inputs: List[Tensor] = []
        self.grads: List[Tensor] = []
        self.w: Optional[Tensor] = None


class CollectedWeight(torch.autograd.Function):
    """(W^T, b) as they are, for products made once per position of a decode; their
    gradient is computed once, X^T G over the pairs every position's backward kept,
    instead of one product per position and the sum of them. Autograd runs this
    backward after every product's (it consumes their outputs)."""

    @staticmethod
    def forward(ctx, pairs: Pairs, wt: Tensor, b: Optional[Tensor]):
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


class Product(torch.autograd.Function):
    """x W^T + b of ``CollectedWeight``'s (W^T, b): its backward gives x's gradient and
    keeps (x, output gradient) for the weight's."""

    @staticmethod
    def forward(ctx, x: Tensor, wt: Tensor, b: Optional[Tensor], pairs: Pairs) -> Tensor:
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


class CollectedTable(torch.autograd.Function):
    """A table (token or position embeddings) as it is, for rows gathered once per position
    of a decode (``Gathered``); its gradient is one index_add of every position's rows'
    gradients, not a table-sized gradient per position and their sum."""

    @staticmethod
    def forward(ctx, pairs: Pairs, table: Tensor):
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


class Gathered(torch.autograd.Function):
    """Rows ``index`` of ``CollectedTable``'s table: its backward keeps (index, gradient)."""

    @staticmethod
    def forward(ctx, table: Tensor, index: Tensor, pairs: Pairs) -> Tensor:
        ctx.save_for_backward(index)
        ctx.pairs = pairs
        return table.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, = ctx.saved_tensors
        ctx.pairs.inputs.append(index)
        ctx.pairs.grads.append(grad)
        return None, None, None
