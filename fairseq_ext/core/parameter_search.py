"""MLE-guided parameter search (MGS), Welleck & Cho: the parameter-space math.

Pure PyTorch over a list of parameter tensors; no fairseq import.

One MGS update (Algorithm 1): given the MLE gradient g (clipped, eq. in A.4),
draw K directions from the proposal (eq. 4; the MLE component is centred on the
descent direction -g, as in the published implementation)

    q(Delta) = pi N(Delta | 0, sigma^2) + (1 - pi) N(Delta | -g, sigma^2),

weight them by self-normalised importance sampling (eq. 2-3, A.1)

    w_k = softmax_k( alpha (C(theta) - C(theta + Delta_k)) - log q(Delta_k) ),

and return Delta = sum_k w_k Delta_k.

One implementation of the update, in two memory modes. Each Delta_k is a deterministic
function of (seed, k, tensor index): the mixture component comes from a per-(seed, k)
generator, the Gaussian noise of tensor i from a per-(seed, k, i) generator, so Delta_k is
drawn again wherever it is needed, never kept. ``ParameterSearch.deltas(k, lean)`` gives
Delta_k and its log q and norm (``_info``: the squared distances from float64 sums of the
draws, log q being a difference of large terms), and ``direction(weights, lean)`` the
update Delta, both either

- ``lean`` (``--mgs-candidate-evaluation sequential``): tensor by tensor, every draw
  written into one scratch tensor the size of the largest parameter; ``perturbed(k)``
  adds Delta_k to the parameters in place and restores them bitwise from one backup.
  Extra memory: one copy of the parameters, whatever K; or
- all at once (``batched``): each candidate's draws into one flat buffer, the squared
  distances of every tensor in one segmented sum; ``stacked`` writes theta and every
  theta + Delta_k into one (K + 1, P) tensor (``StackedSets`` keeps it between updates)
  for decoding them in one pass. Extra memory: the K + 1 copies, the flat gradient, one
  flat draw and per-element sigmas; the operators an update launches do not grow with
  the number of parameter tensors beyond one draw per tensor and candidate.

Both give the parameters the same values, bitwise, and log q, norms and direction to
rounding. Workers that share the seed draw identical directions.
"""
import contextlib
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fairseq_ext.core.constraints import CONSTRAINT, OneOf, above, at_least, between, check_fields
from fairseq_ext.core.sampling import mix_seed

PROPOSALS = ("mixture", "zero", "mle")
IMPORTANCE = ("unit", "exact", "none")
NOISE_SCALES = ("per_tensor", "global", "absolute")
_LOG_2PI = math.log(2 * math.pi)


@dataclass
class ProposalConfig:
    """The proposal q and the importance density (see the module docstring).

    num_candidates: K.
    mixture: pi, probability of the zero-mean component (sampled per candidate).
    alternate: instead of sampling, candidate k uses the MLE component for even k
        (k = 0, 2, ...) and the zero-mean component for odd k, the published code's
        alternation (its perturbation adds the gradient when ``i % 2 == 0``); for odd
        K the MLE component gets one candidate more.
    proposal: ``mixture``, or only the ``zero``-mean or only the ``mle`` component
        (the ablation of Table 7).
    noise: the noise level; sigma per tensor w = noise * mean|g_w| (``per_tensor``,
        A.4), one sigma = noise * mean|g| over all parameters (``global``), or
        sigma = noise (``absolute``).
    importance: the density used for log q: ``exact`` (the mixture with the true
        sigmas), ``unit`` (unit variance, as in the published code), or ``none``
        (log q = 0: a reward-weighted average).
    """

    num_candidates: int = field(default=4, metadata={CONSTRAINT: at_least(1)})
    mixture: float = field(default=0.5, metadata={CONSTRAINT: between(0, 1)})
    alternate: bool = False
    proposal: str = field(default="mixture", metadata={CONSTRAINT: OneOf(PROPOSALS)})
    noise: float = field(default=1.0, metadata={CONSTRAINT: above(0)})
    noise_scale: str = field(default="per_tensor", metadata={CONSTRAINT: OneOf(NOISE_SCALES)})
    importance: str = field(default="unit", metadata={CONSTRAINT: OneOf(IMPORTANCE)})

    def __post_init__(self) -> None:
        check_fields(self)  # ParameterError naming the field

    @property
    def pi(self) -> float:
        """Effective weight of the zero-mean component in q."""
        return {"mixture": self.mixture, "zero": 1.0, "mle": 0.0}[self.proposal]


def noise_scales(grad: Tensor, sizes: Sequence[int], noise: float, mode: str) -> List[float]:
    """sigma per tensor of a flat gradient cut into tensors of ``sizes``: noise * mean|g_w|
    (per_tensor), noise * mean|g| (global) or noise (absolute)."""
    if mode == "absolute":
        return [float(noise)] * len(sizes)
    l1 = segment_sums(grad.abs(), sizes).tolist()
    if mode == "global":
        return [noise * sum(l1) / max(sum(sizes), 1)] * len(sizes)
    return [noise * a / n if n else 0.0 for a, n in zip(l1, sizes)]


def segment_sums(flat: Tensor, sizes: Sequence[int], width: int = 256) -> Tensor:
    """(n,) float64 sums of a flat vector over consecutive segments of the given sizes, in
    a fixed number of operators: float32 sums of rows of ``width`` values (pairwise
    summation), accumulated in float64, and the rows cut by a segment boundary summed
    again in float64 from their start to the boundary. Error within about 1e-8 of the
    sum of magnitudes (float32 dot products of 500k squares: about 1e-6), one pass over
    the vector and no float64 copy of it."""
    flat = flat.reshape(-1).float()
    total, device = flat.numel(), flat.device
    rows = total // width
    bounds = torch.tensor([0] + list(itertools.accumulate(sizes)), device=device)
    prefix = torch.zeros(rows + 1, dtype=torch.float64, device=device)  # sum of the first r full rows
    if rows:
        main = flat[: rows * width].view(rows, width)
        prefix[1:] = main.sum(1).double().cumsum(0)
        row, col = (bounds // width).clamp(max=rows - 1), bounds % width
        partial = main.index_select(0, row).double().cumsum(1).gather(1, (col - 1).clamp(min=0)[:, None])[:, 0]
        inside = (col > 0) & (bounds < rows * width)
        before = prefix[bounds // width].where(bounds < rows * width, prefix[rows]) + partial.where(inside, 0.0)
    else:
        before = torch.zeros(len(bounds), dtype=torch.float64, device=device)
    tail = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), flat[rows * width:].double().cumsum(0)])
    after_rows = bounds - rows * width
    before = before.where(after_rows <= 0, prefix[rows] + tail[after_rows.clamp(min=0)])
    return before[1:] - before[:-1]


def sq_norm(t: Tensor) -> float:
    """||t||^2 as a Python float: one float32 dot product, no copy of ``t``
    (half-precision tensors are upcast)."""
    flat = t.reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.float()
    return float(torch.dot(flat, flat))


def clip_grad_(grads: Sequence[Tensor], max_norm: float) -> float:
    """Scale ``grads`` in place to L2 norm <= max_norm (<= 0: no clipping); returns the norm before."""
    norm = math.sqrt(sum(sq_norm(g) for g in grads))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads:
            g.mul_(scale)
    return norm


def mgs_weights(c0: float, costs: Tensor, log_q: Tensor, alpha: float) -> Tensor:
    """w = softmax(alpha (C(theta) - C(theta + Delta_k)) - log q(Delta_k)) (eq. 3, A.1), in log space.

    costs, log_q: (K,). Returns (K,) float64 weights summing to 1.
    """
    logits = alpha * (c0 - costs.double()) - log_q.double()
    return torch.softmax(logits, dim=0)


def gaussian_log_density(sq_dist: float, numel: int, sigma: float) -> float:
    """log N(x | mu, sigma^2 I) in ``numel`` dimensions, given ||x - mu||^2."""
    if sigma <= 0:
        return 0.0
    return -0.5 * sq_dist / sigma**2 - numel * (math.log(sigma) + 0.5 * _LOG_2PI)


def _log_gaussians(sq_dist: Tensor, numel: Tensor, sigma: Tensor) -> Tensor:
    """``gaussian_log_density`` elementwise over tensors (float64; sigma <= 0 gives 0)."""
    safe = torch.where(sigma > 0, sigma, torch.ones_like(sigma))
    out = -0.5 * sq_dist / safe**2 - numel * (torch.log(safe) + 0.5 * _LOG_2PI)
    return torch.where(sigma > 0, out, torch.zeros_like(out))


def mixture_log_q(log_n_zero: float, log_n_mle: float, pi: float) -> float:
    """log(pi N_zero + (1 - pi) N_mle) with empty components dropped, by logsumexp."""
    terms = []
    if pi > 0:
        terms.append(math.log(pi) + log_n_zero)
    if pi < 1:
        terms.append(math.log1p(-pi) + log_n_mle)
    return float(torch.logsumexp(torch.tensor(terms, dtype=torch.float64), dim=0))


class ParameterSearch:
    """Candidate directions for one MGS update over ``params`` (see module docstring).

    params: the parameters theta (modified in place by ``perturbed`` and restored).
    grads: the (clipped) MLE gradient g, one tensor per parameter.
    cfg: the proposal; seed: one per update (and micro-batch), shared by all workers.
    """

    def __init__(self, params: Sequence[Tensor], grads: Sequence[Tensor], cfg: ProposalConfig, seed: int):
        self.params = list(params)
        self.sizes = [p.numel() for p in self.params]
        if isinstance(grads, Tensor):  # already one flat vector
            self.flat_grad = grads.detach().reshape(-1)
        else:
            self.flat_grad = torch.cat([g.detach().reshape(-1) for g in grads])
        self.grads = self.split(self.flat_grad)
        self.cfg = cfg
        self.seed = seed
        self.sigmas = noise_scales(self.flat_grad, self.sizes, cfg.noise, cfg.noise_scale)
        self.is_mle = [self._component(k) for k in range(cfg.num_candidates)]
        self._backup: Optional[List[Tensor]] = None
        self._scratch: Optional[Tensor] = None
        self._gg_per_tensor: Optional[Tensor] = None
        self._flat_state = None
        self.info: Optional[dict] = None  # the last ``deltas``' Delta_k {"log_q", "norm"}
        self._per_tensor: Optional[tuple] = None

    def _gg(self) -> Tensor:
        """(n,) float64 ||g_i||^2 of every tensor."""
        if self._gg_per_tensor is None:
            g = self.flat_grad.float()
            self._gg_per_tensor = segment_sums(g * g, self.sizes)
        return self._gg_per_tensor

    def _component(self, k: int) -> bool:
        """True if candidate k is drawn from the MLE component."""
        if self.cfg.proposal != "mixture":
            return self.cfg.proposal == "mle"
        if self.cfg.alternate:
            return k % 2 == 0
        g = torch.Generator().manual_seed(mix_seed(self.seed, k, 0x6D6978))
        return bool(torch.rand((), generator=g) >= self.cfg.mixture)

    def _noise(self, k: int, i: int, reuse: bool = False) -> Tensor:
        """eps_{k,i} ~ N(0, I) of tensor i's shape, from its own (seed, k, i) generator
        (float32 draws, cast to the parameter's dtype). ``reuse``: written into the
        shared scratch buffer (valid until the next reusing draw) instead of a new
        tensor; the same numbers either way."""
        p = self.params[i]
        gen = torch.Generator(device=p.device).manual_seed(mix_seed(self.seed, k, i))
        if reuse:
            if self._scratch is None:
                size = max(q.numel() for q in self.params)
                self._scratch = torch.empty(size, device=p.device, dtype=torch.float32)
            eps = self._scratch[: p.numel()].view(p.shape).normal_(generator=gen)
        else:
            eps = torch.empty(p.shape, device=p.device, dtype=torch.float32).normal_(generator=gen)
        return eps.to(p.dtype)

    def piece(self, k: int, i: int) -> Tensor:
        """Delta_k restricted to tensor i: -g_i [MLE component] + sigma_i * eps_{k,i} (a new tensor)."""
        delta = self._noise(k, i).mul_(self.sigmas[i])
        if self.is_mle[k]:
            delta.sub_(self.grads[i].to(delta.dtype))
        return delta

    def _flat(self) -> dict:
        """Flat views of the update, built once: gradient (float32), per-element sigmas, a
        draw buffer and its per-tensor views, the tensors' sizes."""
        if self._flat_state is None:
            device, sizes = self.flat_grad.device, self.sizes
            if len(set(self.sigmas)) == 1:
                sigma = torch.tensor(self.sigmas[0], dtype=torch.float32, device=device)
            else:
                sigma = torch.tensor(self.sigmas, dtype=torch.float32, device=device).repeat_interleave(
                    torch.tensor(sizes, device=device))
            eps = torch.empty(sum(sizes), dtype=torch.float32, device=device)
            self._flat_state = {"g": self.flat_grad.float(), "sigma": sigma, "eps": eps, "views": list(eps.split(sizes))}
        return self._flat_state

    def _draw_flat(self, k: int) -> Tensor:
        """eps_k of every tensor into the flat draw buffer (each tensor's numbers from its own
        (seed, k, i) generator, as ``_noise``)."""
        f = self._flat()
        for i, view in enumerate(f["views"]):
            gen = torch.Generator(device=view.device).manual_seed(mix_seed(self.seed, k, i))
            view.normal_(generator=gen)
        return f["eps"]

    def _info(self, k: int, ee: Tensor, eg: Tensor) -> dict:
        """Delta_k's {"log_q": log q(Delta_k) under ``cfg.importance``, "norm": ||Delta_k||}
        from its draws' per-tensor float64 sums ee_i = ||eps_i||^2 and eg_i = <eps_i, g_i>,
        without forming Delta + g: with gg = ||g||^2 and s = sigma_i, a zero-mean draw has
        ||Delta||^2 = s^2 ee and ||Delta + g||^2 = s^2 ee + 2 s eg + gg; an MLE draw
        ||Delta + g||^2 = s^2 ee and ||Delta||^2 = s^2 ee - 2 s eg + gg."""
        if self._per_tensor is None:  # (sigma_i, numel_i, ||g_i||^2) as float64 on the CPU, once per update
            self._per_tensor = (torch.tensor(self.sigmas, dtype=torch.float64),
                                torch.tensor(self.sizes, dtype=torch.float64), self._gg().cpu())
        s, n, gg = self._per_tensor
        mle = self.is_mle[k]
        own = s * s * ee
        other = own + (-2.0 if mle else 2.0) * s * eg + gg
        sq_zero, sq_mle = (other, own) if mle else (own, other)
        log_q = 0.0
        if self.cfg.importance != "none":
            scale = s if self.cfg.importance == "exact" else torch.ones_like(s)
            log_q = mixture_log_q(_log_gaussians(sq_zero, n, scale).sum().item(),
                                  _log_gaussians(sq_mle, n, scale).sum().item(), self.cfg.pi)
        return {"log_q": log_q, "norm": math.sqrt(max(float(sq_zero.sum()), 0.0))}

    def deltas(self, k: int, lean: bool) -> Iterator[tuple]:
        """Delta_k = sigma eps_k (- g for an MLE draw), in the parameters' dtype, as
        (index, values) pieces: ``lean``, tensor by tensor (index i, values of tensor i's
        shape, drawn into one scratch buffer valid until the next piece: memory of one
        tensor); else all at once (index None, one flat (P,) vector drawn into a flat buffer:
        fewer operators). The same numbers either way. Afterwards ``self.info`` is Delta_k's
        ``_info``."""
        mle = self.is_mle[k]
        if lean:
            ee, eg = [], []
            for i, p in enumerate(self.params):
                eps, g = self._noise(k, i, reuse=True), self.grads[i]
                e64 = eps.reshape(-1).double()  # float64 sums: log q is a difference of large terms
                ee.append(float(torch.dot(e64, e64)))
                eg.append(float(torch.dot(e64, g.reshape(-1).double())))
                del e64
                delta = eps.mul_(self.sigmas[i])
                yield i, (delta.sub_(g.to(delta.dtype)) if mle else delta)
            ee, eg = torch.tensor(ee, dtype=torch.float64), torch.tensor(eg, dtype=torch.float64)
        else:
            f, dtype = self._flat(), self.params[0].dtype
            cast = self._draw_flat(k).to(dtype)
            e32 = cast.float()
            ee, eg = segment_sums(e32 * e32, self.sizes).cpu(), segment_sums(e32 * f["g"], self.sizes).cpu()
            del e32
            delta = cast.mul_(f["sigma"].to(dtype))
            yield None, (delta.sub_(f["g"].to(dtype)) if mle else delta)
        self.info = self._info(k, ee, eg)

    @contextlib.contextmanager
    def perturbed(self, k: int) -> Iterator[dict]:
        """theta <- theta + Delta_k inside the block (``deltas(k, lean=True)``), restored bitwise
        afterwards from one backup of theta, made once per update. Yields Delta_k's
        {"log_q", "norm"}."""
        if self._backup is None:
            self._backup = [p.detach().clone() for p in self.params]
        try:
            with torch.no_grad():
                for i, delta in self.deltas(k, lean=True):
                    self.params[i].add_(delta)
            yield self.info
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, self._backup):
                    p.copy_(b)

    def stacked(self, out: Optional[Tensor] = None) -> tuple:
        """(W, infos): W (K + 1, P) holds theta (row 0) and theta + Delta_k (row k + 1), the
        parameters flattened in order, each row the values ``perturbed(k)`` gives them
        (``deltas(k, lean=False)``); infos the K ``{"log_q", "norm"}``. The parameters are not
        touched. ``out``: a (K + 1, P) tensor of the parameters' dtype to write into."""
        k_count, dtype = self.cfg.num_candidates, self.params[0].dtype
        if out is None:
            out = torch.empty(k_count + 1, sum(self.sizes), dtype=dtype, device=self.flat_grad.device)
        theta = out[0]
        torch.cat([p.detach().reshape(-1) for p in self.params], out=theta)
        infos = []
        for k in range(k_count):
            for _, delta in self.deltas(k, lean=False):
                torch.add(theta, delta, out=out[k + 1])
            infos.append(self.info)
        return out, infos

    def split(self, flat: Tensor) -> List[Tensor]:
        """A flat (P,) vector as per-parameter views (shapes of ``params``)."""
        return [v.view(p.shape) for v, p in zip(flat.split(self.sizes), self.params)]

    def direction(self, weights: Tensor, lean: bool = False) -> Tensor:
        """Delta = sum_k w_k Delta_k (weights: (K,)) as one flat (P,) vector in the parameters'
        dtype: sum_k w_k sigma eps_k - (the MLE candidates' summed weight) g, from the draws of
        ``deltas`` regenerated (``lean``: tensor by tensor, into the scratch buffer; else each
        candidate's at once, into the flat buffer). Frees the backup and both buffers."""
        self._backup = None
        w = [float(x) for x in weights]
        w_mle = sum(wk for wk, mle in zip(w, self.is_mle) if mle)
        out = torch.zeros(sum(self.sizes), dtype=self.params[0].dtype, device=self.flat_grad.device)
        if lean:
            for i, acc in enumerate(self.split(out)):
                for k, wk in enumerate(w):
                    if wk != 0.0:
                        acc.add_(self._noise(k, i, reuse=True), alpha=wk * self.sigmas[i])
                if w_mle != 0.0:
                    acc.sub_(self.grads[i].to(acc.dtype), alpha=w_mle)
        else:
            f = self._flat()
            acc = torch.zeros_like(f["eps"])
            for k, wk in enumerate(w):
                if wk != 0.0:
                    acc.add_(self._draw_flat(k), alpha=wk)
            acc.mul_(f["sigma"])
            if w_mle != 0.0:
                acc.sub_(f["g"], alpha=w_mle)
            out.copy_(acc)
        self._scratch, self._flat_state = None, None
        return out


def weight_stats(weights: Tensor, is_mle: Sequence[bool]) -> dict:
    """Diagnostics of Figures 2, 3, 6, 7: entropy, std, total MLE-component weight,
    whether the top candidate came from the MLE component."""
    w = weights.double()
    ent = float(-(w * torch.log(w.clamp_min(1e-300))).sum())
    mle_mask = torch.tensor(list(is_mle), dtype=torch.bool)
    return {
        "weight_entropy": ent,
        "weight_std": float(w.std(unbiased=False)),
        "mle_weight": float(w[mle_mask].sum()) if bool(mle_mask.any()) else 0.0,
        "top_is_mle": float(bool(is_mle[int(w.argmax())])),
    }


class StackedSets:
    """theta and its K perturbations as G = K + 1 parameter sets for a grouped decode: the
    (G, P) buffer ``ParameterSearch.stacked`` writes, kept between updates (made again when
    the parameters, K, dtype or device change), and each parameter's (G, *shape) view."""

    def __init__(self):
        self._key, self._buffer, self._views = None, None, {}

    def fill(self, search: "ParameterSearch") -> Tuple[int, Callable[[Tensor], Tensor], List[dict]]:
        """(G, ``stack(p)``: parameter p's (G, *p.shape) values, the candidates' infos): the
        buffer filled for this update's ``search``; a parameter the search does not move
        (not trained) is the same in every set."""
        params, count = search.params, search.cfg.num_candidates + 1
        key = (count, params[0].dtype, params[0].device, tuple(id(p) for p in params))
        if self._key != key:
            self._buffer, self._views = None, {}  # the old buffer goes first
            self._buffer = torch.empty(count, sum(search.sizes), dtype=params[0].dtype, device=params[0].device)
            self._views = {p: v.view(count, *p.shape) for p, v in zip(params, self._buffer.split(search.sizes, 1))}
            self._key = key
        _, infos = search.stacked(out=self._buffer)
        views = self._views
        return count, (lambda p: views[p] if p in views else p.detach().expand(count, *p.shape)), infos
