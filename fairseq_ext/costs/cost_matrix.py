"""The cost matrix of one input for MBR decoding: its candidates against its
pseudo-references under a ``BatchScorer``'s weighted costs, computed on demand.

Each cost converts the candidates, the references and the source once (text, symbols
or ids, ``SequenceCost``), and a neural cost's ``prepare`` runs once on the references.
Entries are computed when first asked for (``block``) and kept, so pruning, which asks
for columns block by block, never computes one twice. A cost that reads no reference
(a quality estimator, ``lm``) is one value per candidate, the same in every column.
"""
import math
import time
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from fairseq_ext.costs.batch_scorer import BatchScorer


class _Part:
    """One weighted cost of the matrix, its inputs converted once."""

    def __init__(self, weight: float, cost, hyps: Sequence[Tensor], refs: Sequence[Tensor], source: Optional[Tensor],
                 device):
        self.weight, self.cost = weight, cost
        cost.setup(device)
        self.hyps = cost.convert_hyps(hyps)
        self.source = cost.convert_sources([source])[0] if cost.needs_source else None
        self.uses_refs = cost.needs_reference
        # prepare: one item per (reference, source) for a cost that reads references, one for the source alone
        # otherwise (as BatchScorer prepares one item per input)
        if self.uses_refs:
            self.refs = cost.convert_refs(refs)
            sources = [self.source] * len(self.refs) if self.source is not None else None
            self.prepared = cost.loss.prepare(self.refs, sources)
        else:
            self.refs = None
            self.prepared = cost.loss.prepare(None, [self.source] if self.source is not None else None)

    def pairs(self, rows: List[int], cols: List[int]) -> Tensor:
        """Costs of the pairs (rows[k], cols[k])."""
        sources = [self.source] * len(rows) if self.source is not None else None
        prepared = [self.prepared[c] for c in cols] if self.prepared is not None else None
        return self.cost.from_converted([self.hyps[r] for r in rows], [self.refs[c] for c in cols], sources, prepared)

    def alone(self) -> Tensor:
        """Costs (H,) of a reference-free cost."""
        sources = [self.source] * len(self.hyps) if self.source is not None else None
        prepared = [self.prepared[0]] * len(self.hyps) if self.prepared is not None else None
        return self.cost.from_converted(self.hyps, None, sources, prepared)


class CostMatrix:
    """C(h_i, r_j) = sum_k w_k C_k(h_i, r_j) for the H candidates ``hyps`` and the R
    references ``refs`` (1-D id tensors of the target dictionary) of one input whose source
    is ``source`` (ids; None: no source), under ``scorer``'s costs and weights.

    ``evaluations`` counts the cost values computed: one per pair and cost that reads the
    reference, one per candidate for one that does not."""

    def __init__(self, scorer: BatchScorer, hyps: Sequence[Tensor], refs: Sequence[Tensor],
                 source: Optional[Tensor] = None, device=None):
        start = time.perf_counter()
        device = device if device is not None else (hyps[0].device if len(hyps) else torch.device("cpu"))
        self.num_hyps, self.num_refs = len(hyps), len(refs)
        self.parts = [_Part(w, scorer.costs[name], hyps, refs, source, device) for name, w in scorer.weights.items()]
        self.evaluations = 0
        self.free = torch.zeros(self.num_hyps, dtype=torch.float64)  # the reference-free parts' weighted sum
        for part in self.parts:
            if not part.uses_refs:
                self.free += part.weight * part.alone().double()
                self.evaluations += self.num_hyps
        self.values = torch.full((self.num_hyps, self.num_refs), math.nan, dtype=torch.float64)
        self.seconds = time.perf_counter() - start  # spent computing costs (conversions included)

    @property
    def needs_references(self) -> bool:
        """False when every cost is reference-free (QE reranking: one column)."""
        return any(part.uses_refs for part in self.parts)

    def block(self, rows: Tensor, cols: Tensor) -> Tensor:
        """(len(rows), len(cols)) costs, computing only the entries not computed before."""
        rows, cols = torch.as_tensor(rows).long(), torch.as_tensor(cols).long()
        sub = self.values[rows[:, None], cols[None, :]]
        missing = sub.isnan().nonzero()
        if missing.numel():
            start = time.perf_counter()
            r, c = rows[missing[:, 0]].tolist(), cols[missing[:, 1]].tolist()
            total = torch.zeros(len(r), dtype=torch.float64)
            for part in self.parts:
                if part.uses_refs:
                    total += part.weight * part.pairs(r, c).double()
                    self.evaluations += len(r)
            self.values[r, c] = total
            sub = self.values[rows[:, None], cols[None, :]]
            self.seconds += time.perf_counter() - start
        return sub + self.free[rows][:, None]

    def full(self) -> Tensor:
        """The whole (H, R) matrix."""
        return self.block(torch.arange(self.num_hyps), torch.arange(self.num_refs))

    def aggregated(self, weights: Optional[Sequence[float]] = None) -> Tensor:
        """Costs (H,) of every candidate against the aggregate of the references (weights:
        one per reference, None: uniform; ``TaskLoss.aggregated_cost``)."""
        start = time.perf_counter()
        total = self.free.clone()
        for part in self.parts:
            if part.uses_refs:
                costs = part.cost.loss.aggregated_cost(part.hyps, part.refs, weights, part.source)
                total += part.weight * torch.as_tensor(costs).double()
                self.evaluations += self.num_hyps
        self.seconds += time.perf_counter() - start
        return total


def not_aggregatable(scorer: BatchScorer) -> List[str]:
    """The names of ``scorer``'s reference-reading costs that have no aggregated form."""
    return [name for name, cost in scorer.costs.items() if cost.needs_reference and not cost.loss.aggregatable]
