"""Metropolis-Hastings sampling from the energy of a masked language model
(Goyal, PhD thesis, chapter 6; Goyal, Dyer and Berg-Kirkpatrick, 2021).

Pure PyTorch: the masked LM is a callback, so the same kernels run on fairseq's
``cmlm_transformer`` (``fairseq_ext/generators/mh_sampler.py``) and on the
enumerable toys of the tests.

``logits_fn(tokens, owner, positions) -> (N, P, V)``: ``tokens`` (N, L) with the mask
symbol at masked positions, ``owner`` (N,) the index of the context (source
sentence) each row is conditioned on, ``positions`` (N, P) the positions whose
masked-LM logits are wanted. The logits at a masked position t are the scores
``f(w, h(y without t))`` of section 6.2.1.

Energies (section 6.2): with y^{(t)} = y with position t masked,

- ``raw``   (6.2.1): E_raw(y)   = - sum_t logit_t(y^{(t)})[y_t]
- ``local`` (6.2.4): E_local(y) = - sum_t log p_mlm(y_t | y^{(t)})

Both come from the same T single-masked copies of y, evaluated here as one
batched forward for all chains and sentences (Algorithm 4 runs one forward per
position, twice per proposal).

Proposal (section 6.4, 6.4.1): mask the block I, draw y'_i ~ q_i for i in I from
q_i = softmax(filter(logit_i / temperature)) (nucleus filter), all from one forward
of y with I masked. With a nucleus (top-p < 1) and ``nucleus_mix`` eps > 0 the
proposal is the mixture q_i = (1 - eps) q_nucleus,i + eps q_full,i: a pure nucleus
can make the chain reducible (a token outside the nucleus of its own context can
never be proposed back, so some states can never be left), and then the chain
samples p only within the class of its start; the mixture gives every allowed
token positive probability, so the chain is irreducible and converges to p from
any start. Since y and y' agree outside I, the same forward gives
q(y'|y) = prod_i q_i(y'_i) and q(y|y') = prod_i q_i(y_i). Acceptance (section 6.3):

    log a = min(0, (E(y) - E(y')) / T_target + log q(y|y') - log q(y'|y))

in log space; a rejected proposal keeps y and its energy, so each proposal costs
one energy evaluation (Algorithm 4 line 6 recomputes E(y)). ``kernel="gibbs"`` is
the degenerate Gibbs sampler of Wang and Cho (2019) (section 6.6): every proposal is
accepted.
"""
import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.core.constraints import (
    CONSTRAINT,
    OneOf,
    ParameterError,
    above,
    at_least,
    between,
    check_fields,
)
from fairseq_ext.core.sampling import filter_logits

LogitsFn = Callable[[Tensor, Tensor, Tensor], Tensor]

ENERGIES = ("raw", "local")
KERNELS = ("mh", "gibbs")
ORDERS = ("random", "left-to-right")


def masked_logits(logits_fn: LogitsFn, tokens: Tensor, owner: Tensor, positions: Tensor,
                  max_rows: int = 0) -> Tensor:
    """``logits_fn`` over row chunks of at most ``max_rows`` rows (0: one call).
    tokens (N, L), owner (N,), positions (N, P) -> (N, P, V)."""
    n = tokens.size(0)
    if max_rows <= 0 or n <= max_rows:
        return logits_fn(tokens, owner, positions)
    return torch.cat([logits_fn(tokens[i:i + max_rows], owner[i:i + max_rows], positions[i:i + max_rows])
                      for i in range(0, n, max_rows)], dim=0)


def single_masked_copies(tokens: Tensor, free: Tensor, mask_idx: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The copies y^{(t)} of every row for every free position t.

    tokens, free: (C, L). Returns ``copies`` (M, L) with M = free.sum(), ``row`` (M,)
    the row each copy belongs to, ``pos`` (M,) its masked position.
    """
    row, pos = free.nonzero(as_tuple=True)
    copies = tokens[row].clone()
    copies[torch.arange(row.numel(), device=tokens.device), pos] = mask_idx
    return copies, row, pos


def energy_terms(logits_fn: LogitsFn, tokens: Tensor, free: Tensor, owner: Tensor, mask_idx: int,
                 max_rows: int = 0) -> Tuple[Tensor, Tensor]:
    """The positional terms of E_raw and E_local (section 6.2.1, 6.2.4):
    -logit_t(y^{(t)})[y_t] and -log p_mlm(y_t | y^{(t)}) at free positions, 0 elsewhere.

    tokens, free: (C, L); owner: (C,). One batched forward over all single-masked
    copies (chunked by ``max_rows``). Returns two (C, L) float tensors.
    """
    copies, row, pos = single_masked_copies(tokens, free, mask_idx)
    raw = torch.zeros(tokens.shape, dtype=torch.float, device=tokens.device)
    local = torch.zeros_like(raw)
    if row.numel() == 0:
        return raw, local
    logits = masked_logits(logits_fn, copies, owner[row], pos[:, None], max_rows)[:, 0].float()
    score = logits.gather(1, tokens[row, pos][:, None]).squeeze(1)
    raw[row, pos] = -score
    local[row, pos] = torch.logsumexp(logits, dim=-1) - score
    return raw, local


def energies(logits_fn: LogitsFn, tokens: Tensor, free: Tensor, owner: Tensor, mask_idx: int,
             max_rows: int = 0) -> Tuple[Tensor, Tensor]:
    """E_raw and E_local of every row: the sums of :func:`energy_terms`, two (C,)."""
    raw, local = energy_terms(logits_fn, tokens, free, owner, mask_idx, max_rows)
    return raw.sum(1), local.sum(1)


def proposal_log_probs(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0,
                       forbidden: Optional[Tensor] = None, nucleus_mix: float = 0.0) -> Tensor:
    """log q_i (section 6.4.1): log-softmax of ``logits`` / temperature over the
    top-p nucleus, never proposing a ``forbidden`` (V,) bool symbol (mask, padding,
    BOS, EOS). With top_p < 1 and ``nucleus_mix`` eps > 0: log of the mixture
    (1 - eps) q_nucleus + eps q_full (q_full: the same without the nucleus filter).
    logits (..., V) -> (..., V), -inf outside the support."""
    if temperature <= 0:
        raise ValueError(f"proposal temperature must be > 0, got {temperature}")
    if not 0 <= nucleus_mix < 1:
        raise ValueError(f"nucleus mix must be in [0, 1), got {nucleus_mix}")
    scaled = logits.float() / temperature
    if forbidden is not None:
        scaled = scaled.masked_fill(forbidden, float("-inf"))
    nucleus = torch.log_softmax(filter_logits(scaled, topp=top_p), dim=-1)
    if top_p >= 1 or nucleus_mix == 0:
        return nucleus
    full = torch.log_softmax(scaled, dim=-1)
    return torch.logaddexp(nucleus + math.log1p(-nucleus_mix), full + math.log(nucleus_mix))


def gumbel_draw(log_q: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """One draw per row of the categorical exp(log_q) (..., V) by Gumbel-max."""
    u = torch.rand(log_q.shape, generator=generator, device=log_q.device).clamp_(1e-20, 1.0 - 1e-7)
    return (log_q - torch.log(-torch.log(u))).argmax(dim=-1)


@dataclass
class Proposal:
    """A block proposal for C chains: ``tokens`` y' (C, L), ``log_q_fwd`` log q(y'|y)
    and ``log_q_bwd`` log q(y|y') (C,)."""
    tokens: Tensor
    log_q_fwd: Tensor
    log_q_bwd: Tensor


def propose(logits_fn: LogitsFn, tokens: Tensor, block: Tensor, owner: Tensor, mask_idx: int,
            temperature: float = 1.0, top_p: float = 1.0, forbidden: Optional[Tensor] = None,
            generator: Optional[torch.Generator] = None, max_rows: int = 0,
            nucleus_mix: float = 0.0) -> Proposal:
    """Block proposal of section 6.4.1 from one forward of y with the block masked.

    tokens, block: (C, L), every row with at least one position in ``block``.
    """
    width = int(block.sum(1).max())
    # positions of each row's block, padded by repeating its first one (masked out below)
    keys = (~block).float() * tokens.size(1) + torch.arange(tokens.size(1), device=tokens.device)
    positions = keys.argsort(dim=1)[:, :width]
    valid = torch.arange(width, device=tokens.device)[None, :] < block.sum(1, keepdim=True)
    log_q = proposal_log_probs(
        masked_logits(logits_fn, tokens.masked_fill(block, mask_idx), owner, positions, max_rows),
        temperature, top_p, forbidden, nucleus_mix)  # (C, P, V)
    new = gumbel_draw(log_q, generator)
    old = tokens.gather(1, positions)
    new = torch.where(valid, new, old)
    zero = log_q.new_zeros(())
    log_q_fwd = torch.where(valid, log_q.gather(2, new[..., None]).squeeze(2), zero).sum(1)
    log_q_bwd = torch.where(valid, log_q.gather(2, old[..., None]).squeeze(2), zero).sum(1)
    return Proposal(tokens.scatter(1, positions, new), log_q_fwd, log_q_bwd)


def log_acceptance(e_old: Tensor, e_new: Tensor, log_q_fwd: Tensor, log_q_bwd: Tensor,
                   target_temperature: float = 1.0) -> Tensor:
    """log a(y'; y) = min(0, (E(y) - E(y'))/T + log q(y|y') - log q(y'|y)) (section 6.3).
    A reverse move of probability zero (-inf) gives -inf: always rejected. (C,)."""
    if target_temperature <= 0:
        raise ValueError(f"target temperature must be > 0, got {target_temperature}")
    log_ratio = (e_old - e_new) / target_temperature + log_q_bwd - log_q_fwd
    return torch.clamp(torch.nan_to_num(log_ratio, nan=float("-inf"), neginf=float("-inf"), posinf=0.0), max=0.0)


def sweep_order(free: Tensor, order: str, generator: Optional[torch.Generator] = None) -> Tensor:
    """One epoch's visiting order (section 6.5): the free positions of each row first,
    left to right or in a uniformly random order (without replacement), then the
    others. free (C, L) -> (C, L) positions."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    L = free.size(1)
    if order == "random":
        keys = torch.rand(free.shape, generator=generator, device=free.device)
    else:
        keys = torch.arange(L, device=free.device, dtype=torch.float).expand(free.shape) / L
    return (keys + (~free).float() * 2.0).argsort(dim=1)


def block_at(order: Tensor, n_free: Tensor, step: int, size: int) -> Tensor:
    """The step-th block of ``size`` positions of an epoch: (C, L) bool, empty for rows
    whose free positions are used up. order (C, L), n_free (C,)."""
    C, L = order.shape
    j = torch.arange(step * size, min((step + 1) * size, L), device=order.device)
    chosen = j[None, :] < n_free[:, None]
    block = torch.zeros(C, L, dtype=torch.bool, device=order.device)
    return block.scatter(1, order[:, j], chosen)


def annealed_block_size(block_size: int, epoch: int, num_epochs: int, anneal: bool) -> int:
    """Block size of an epoch: constant, or linear from ``block_size`` at epoch 0 to 1
    at the last epoch (section 6.7.3)."""
    if not anneal or num_epochs <= 1:
        return block_size
    return max(1, int(round(block_size - (block_size - 1) * epoch / (num_epochs - 1))))


def annealed_target_temperature(t0: float, decrement: float, epoch: int, minimum: float) -> float:
    """Target temperature of an epoch: T0 - decrement * epoch, floored at ``minimum``
    (section 6.8: decrements of 0.02, 0.04, 0.06 per epoch)."""
    return max(minimum, t0 - decrement * epoch)


def floor_at_decrement(t0: float, minimum: float, floor_at: float, total_epochs: int) -> float:
    """The per-epoch decrement of a linear schedule that reaches ``minimum`` at epoch
    round(floor_at * (total_epochs - 1)) (at least epoch 1) and stays there: the
    annealing budget defined by the epochs the chains run, not by a fixed step."""
    last = max(1, round(floor_at * (total_epochs - 1)))
    return max(0.0, t0 - minimum) / last


@dataclass
class MHConfig:
    """Options of :func:`run_chains` (see docs/mh_sampler.md); each field declares the
    values it takes (``check``)."""
    energy: str = field(default="raw", metadata={CONSTRAINT: OneOf(ENERGIES)})
    kernel: str = field(default="mh", metadata={CONSTRAINT: OneOf(KERNELS)})
    burn_in: int = field(default=7, metadata={CONSTRAINT: at_least(0)})
    epochs: int = field(default=26, metadata={CONSTRAINT: at_least(1)})
    order: str = field(default="random", metadata={CONSTRAINT: OneOf(ORDERS)})
    block_size: int = field(default=1, metadata={CONSTRAINT: at_least(1)})
    anneal_block: bool = False
    proposal_temperature: float = field(default=1.0, metadata={CONSTRAINT: above(0)})
    top_p: float = field(default=1.0, metadata={CONSTRAINT: between(0, 1, low_open=True)})
    nucleus_mix: float = field(default=0.1, metadata={CONSTRAINT: between(0, 1, high_open=True)})
    target_temperature: float = field(default=1.0, metadata={CONSTRAINT: above(0)})
    target_anneal: float = field(default=0.0, metadata={CONSTRAINT: at_least(0)})
    anneal_floor_at: float = field(default=0.0, metadata={CONSTRAINT: between(0, 1)})  # a fraction of the epochs
    min_target_temperature: float = field(default=0.05, metadata={CONSTRAINT: above(0)})
    accept_all_epochs: int = field(default=0, metadata={CONSTRAINT: at_least(0)})
    max_rows: int = field(default=0, metadata={CONSTRAINT: at_least(0)})

    def check(self) -> "MHConfig":
        """Raise ParameterError naming the first bad field; returns self."""
        check_fields(self)
        if self.anneal_floor_at > 0 and self.target_anneal > 0:
            raise ParameterError(MHConfig, "target_anneal", "and {anneal_floor_at} are two annealing schedules: "
                                 f"give one, got {self.target_anneal!r} and {self.anneal_floor_at!r}")
        return self

    def target_temperature_at(self, epoch: int) -> float:
        """The target temperature of ``epoch`` (0-based, burn-in included): constant,
        minus ``target_anneal`` per epoch, or linear to the floor at the fraction
        ``anneal_floor_at`` of all epochs; never below ``min_target_temperature``."""
        decrement = self.target_anneal
        if self.anneal_floor_at > 0:
            decrement = floor_at_decrement(self.target_temperature, self.min_target_temperature,
                                           self.anneal_floor_at, self.total_epochs)
        return annealed_target_temperature(self.target_temperature, decrement, epoch, self.min_target_temperature)

    @property
    def total_epochs(self) -> int:
        return self.burn_in + self.epochs


@dataclass
class ChainStats:
    """Per-epoch statistics, each a list over epochs of (C,) tensors: proposals made,
    accepted, novel (accepted and different from the current state), the
    energies of the state at the end of the epoch, and the lowest chosen energy
    (``cfg.energy``) visited so far."""
    proposals: List[Tensor] = field(default_factory=list)
    accepted: List[Tensor] = field(default_factory=list)
    novel: List[Tensor] = field(default_factory=list)
    e_raw: List[Tensor] = field(default_factory=list)
    e_local: List[Tensor] = field(default_factory=list)
    e_best: List[Tensor] = field(default_factory=list)
    target_temperature: List[float] = field(default_factory=list)
    block_size: List[int] = field(default_factory=list)


@dataclass
class ChainResult:
    """Final states (C, L) with their energies (C,), the lowest-energy state each
    chain visited (``best_tokens`` (C, L), its chosen energy ``best_energy`` (C,);
    under annealing, the chain's estimate of the mode), statistics, and the state at
    the end of every epoch when asked (list of (C, L))."""
    tokens: Tensor
    e_raw: Tensor
    e_local: Tensor
    stats: ChainStats
    history: List[Tensor]
    best_tokens: Tensor
    best_energy: Tensor


def run_chains(logits_fn: LogitsFn, tokens: Tensor, free: Tensor, owner: Tensor, mask_idx: int,
               cfg: MHConfig, forbidden: Optional[Tensor] = None,
               generator: Optional[torch.Generator] = None, keep_history: bool = False) -> ChainResult:
    """Run C chains (rows of ``tokens``) for ``cfg.burn_in + cfg.epochs`` epochs.

    tokens: (C, L) initial states; free: (C, L) bool, the positions the chains may
    change (not BOS / EOS / padding); owner: (C,) context index of each chain. An
    epoch visits every free position of a chain once (blocks of the epoch's block
    size, without replacement; section 6.5). Chains are independent given the
    random stream; every proposal of a step is evaluated in one batched forward.
    """
    cfg.check()
    tokens = tokens.clone()
    n_free = free.sum(1)
    e_raw, e_local = energies(logits_fn, tokens, free, owner, mask_idx, cfg.max_rows)
    raw_energy = cfg.energy == "raw"
    best_tokens, best_energy = tokens.clone(), (e_raw if raw_energy else e_local).clone()

    def keep_best(rows: Tensor, energy: Tensor) -> None:
        """Remember the current state of ``rows`` where its energy (C,) is the lowest yet."""
        rows = rows[energy[rows] < best_energy[rows]]
        best_tokens[rows] = tokens[rows]
        best_energy[rows] = energy[rows]

    stats = ChainStats()
    history: List[Tensor] = []
    for epoch in range(cfg.total_epochs):
        size = annealed_block_size(cfg.block_size, epoch, cfg.total_epochs, cfg.anneal_block)
        temp = cfg.target_temperature_at(epoch)
        accept_all = cfg.kernel == "gibbs" or epoch < cfg.accept_all_epochs
        order = sweep_order(free, cfg.order, generator)
        counts = [torch.zeros_like(n_free) for _ in range(3)]
        for step in range(math.ceil(int(n_free.max()) / size) if n_free.numel() else 0):
            block = block_at(order, n_free, step, size)
            rows = block.any(1).nonzero(as_tuple=True)[0]
            y = tokens[rows]
            prop = propose(logits_fn, y, block[rows], owner[rows], mask_idx, cfg.proposal_temperature,
                           cfg.top_p, forbidden, generator, cfg.max_rows, cfg.nucleus_mix)
            if accept_all:  # no energy needed: recomputed once at the end of the epoch
                accept = torch.ones_like(rows, dtype=torch.bool)
            else:
                # a proposal equal to its current state keeps its energy (and log q(y'|y) = log q(y|y'),
                # so it is accepted): only the changed rows need the L masked forwards of E(y')
                new_raw, new_local = e_raw[rows], e_local[rows]  # index copies: e_raw, e_local untouched
                moved = (prop.tokens != y).any(1).nonzero(as_tuple=True)[0]
                if moved.numel():
                    new_raw[moved], new_local[moved] = energies(
                        logits_fn, prop.tokens[moved], free[rows[moved]], owner[rows[moved]], mask_idx, cfg.max_rows)
                e_old, e_new = (e_raw, new_raw) if raw_energy else (e_local, new_local)
                log_a = log_acceptance(e_old[rows], e_new, prop.log_q_fwd, prop.log_q_bwd, temp)
                u = torch.rand(rows.shape, generator=generator, device=tokens.device)
                accept = torch.log(u) < log_a
                e_raw[rows[accept]] = new_raw[accept]
                e_local[rows[accept]] = new_local[accept]
            changed = accept & (prop.tokens != y).any(1)
            tokens[rows[accept]] = prop.tokens[accept]
            if not accept_all:
                keep_best(rows[accept], e_raw if raw_energy else e_local)
            counts[0].index_add_(0, rows, torch.ones_like(rows))
            counts[1].index_add_(0, rows, accept.long())
            counts[2].index_add_(0, rows, changed.long())
        if accept_all:  # the energies are known only at the end of the epoch
            e_raw, e_local = energies(logits_fn, tokens, free, owner, mask_idx, cfg.max_rows)
            keep_best(torch.arange(tokens.size(0), device=tokens.device), e_raw if raw_energy else e_local)
        stats.proposals.append(counts[0])
        stats.accepted.append(counts[1])
        stats.novel.append(counts[2])
        stats.e_raw.append(e_raw.clone())
        stats.e_local.append(e_local.clone())
        stats.e_best.append(best_energy.clone())
        stats.target_temperature.append(temp)
        stats.block_size.append(size)
        if keep_history:
            history.append(tokens.clone())
    return ChainResult(tokens, e_raw, e_local, stats, history, best_tokens, best_energy)
