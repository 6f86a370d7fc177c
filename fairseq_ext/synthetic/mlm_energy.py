"""Masked LMs as energy networks on enumerable synthetic data (Goyal thesis
section 6.2.2-6.2.3, Table 6.1). Pure PyTorch.

Data (length 5, vocabulary 5, so all 3125 sequences can be enumerated):
- ``palindrome``: with probability 0.8 a uniformly random palindrome, else a
  uniformly random non-palindrome;
- ``hmm``: an HMM with 4 hidden states and peaked (low-entropy) random
  transition and emission tables (``hmm-high``: flatter tables).

Model: E_raw(y) = - sum_t f(y_t, h(y without t)) (section 6.2.1) with h_t the
concatenation of a forward LSTM state at t-1 and a backward LSTM state at t+1, so
one bidirectional pass gives the masked-position logits of every position, and the
MLM conditional p_mlm(y_t | y without t) = softmax_w f(w, h_t) (the "free
conditional").

Objectives (all exact, by enumeration where needed):
- ``ll``:  log p(y) = -E(y) - log sum_{y'} exp(-E(y'))  (log Z over all 3125);
- ``pll``: sum_t log p(y_t | y without t) with the model's true conditionals
  p(y_t = w | ...) proportional to exp(-E(y with y_t = w)) (V energies per position);
- ``mlm``: sum_t log p_mlm(y_t | y without t) (degenerate pseudo-likelihood).

Evaluation: the exact cross-entropy -sum_y p_true(y) log p_model(y) in nats (the
expected held-out NLL, Table 6.1's metric without test-sample noise), next to the
entropy of p_true ("True").
"""
import itertools
from dataclasses import dataclass
from typing import Dict

import numpy as np
import torch
from torch import Tensor, nn

V, L = 5, 5
OBJECTIVES = ("ll", "pll", "mlm")
GENERATORS = ("palindrome", "hmm", "hmm-high")


def all_sequences() -> Tensor:
    """(V^L, L): every sequence, in lexicographic order (index = base-V number)."""
    return torch.tensor(list(itertools.product(range(V), repeat=L)))


def true_distribution(kind: str, seed: int) -> Tensor:
    """p_true over ``all_sequences()`` (V^L,) float64."""
    seqs = all_sequences()
    if kind == "palindrome":
        pal = (seqs == seqs.flip(1)).all(1)
        return torch.where(pal, 0.8 / pal.sum(), 0.2 / (~pal).sum()).double()
    if kind not in ("hmm", "hmm-high"):
        raise ValueError(f"unknown generator {kind!r}; choose from {GENERATORS}")
    rng = np.random.RandomState(seed)
    conc = 0.2 if kind == "hmm" else 2.0  # Dirichlet concentration: peaked vs flat tables
    hidden = 4
    start = torch.from_numpy(rng.dirichlet(np.full(hidden, conc)))
    trans = torch.from_numpy(rng.dirichlet(np.full(hidden, conc), size=hidden))
    emit = torch.from_numpy(rng.dirichlet(np.full(V, conc), size=hidden))
    # forward algorithm for every sequence at once
    alpha = start[None, :] * emit[:, seqs[:, 0]].T  # (N, H)
    for t in range(1, L):
        alpha = (alpha @ trans) * emit[:, seqs[:, t]].T
    return alpha.sum(1)


def sample_data(p: Tensor, n: int, seed: int) -> Tensor:
    """n sequences drawn from p (indices into all_sequences())."""
    return torch.multinomial(p.float(), n, replacement=True, generator=torch.Generator().manual_seed(seed))


class BiLSTMEnergy(nn.Module):
    """Masked-position logits f(., h(y without t)) for all t in one pass."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(V, dim)
        self.fwd = nn.LSTM(dim, dim, batch_first=True)
        self.bwd = nn.LSTM(dim, dim, batch_first=True)
        self.start = nn.Parameter(torch.zeros(2, dim))
        self.out = nn.Sequential(nn.Linear(2 * dim, dim), nn.Tanh(), nn.Linear(dim, V))

    def forward(self, y: Tensor) -> Tensor:
        """y (N, L) -> logits (N, L, V); logits[:, t] never sees y[:, t]."""
        x = self.embed(y)
        f, _ = self.fwd(x)
        b, _ = self.bwd(x.flip(1))
        b = b.flip(1)
        n = y.size(0)
        left = torch.cat([self.start[0].expand(n, 1, -1), f[:, :-1]], 1)  # state after y_<t
        right = torch.cat([b[:, 1:], self.start[1].expand(n, 1, -1)], 1)  # state after y_>t
        return self.out(torch.cat([left, right], -1))


def raw_energy(logits: Tensor, y: Tensor) -> Tensor:
    """E_raw(y) = -sum_t logits[t, y_t]: (N, L, V), (N, L) -> (N,)."""
    return -logits.gather(2, y[..., None]).squeeze(2).sum(1)


def log_partition(model: BiLSTMEnergy, seqs: Tensor) -> Tensor:
    return torch.logsumexp(-raw_energy(model(seqs), seqs), 0)


def objective(model: BiLSTMEnergy, kind: str, y: Tensor, seqs: Tensor) -> Tensor:
    """Mean negative training objective over the batch y (N, L)."""
    if kind == "ll":
        return (raw_energy(model(y), y) + log_partition(model, seqs)).mean()
    if kind == "mlm":
        logits = model(y)
        return -torch.log_softmax(logits, -1).gather(2, y[..., None]).sum((1, 2)).mean()
    if kind == "pll":
        n = y.size(0)
        # variants[n, t, w] = y with y_t := w
        variants = y[:, None, None, :].repeat(1, L, V, 1)
        idx = torch.arange(L)
        variants[:, idx, :, idx] = torch.arange(V).expand(n, L, V).permute(1, 0, 2)
        flat = variants.reshape(-1, L)
        e = raw_energy(model(flat), flat).view(n, L, V)
        return -torch.log_softmax(-e, -1).gather(2, y[:, :, None]).sum((1, 2)).mean()
    raise ValueError(f"unknown objective {kind!r}; choose from {OBJECTIVES}")


@torch.no_grad()
def cross_entropy(model: BiLSTMEnergy, p_true: Tensor, seqs: Tensor) -> float:
    """-sum_y p_true(y) log p_model(y), p_model = exp(-E_raw) / Z, in nats."""
    log_p = -raw_energy(model(seqs), seqs) - log_partition(model, seqs)
    return float(-(p_true * log_p.double()).sum())


@dataclass
class TrainConfig:
    steps: int = 400
    lr: float = 0.01
    batch: int = 100
    dim: int = 32
    seed: int = 0


def train(kind: str, data: Tensor, seqs: Tensor, cfg: TrainConfig) -> BiLSTMEnergy:
    torch.manual_seed(cfg.seed)
    model = BiLSTMEnergy(cfg.dim)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.steps):
        batch = seqs[data[torch.randint(len(data), (cfg.batch,), generator=g)]]
        loss = objective(model, kind, batch, seqs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def table_row(kind: str, n_train: int, seed: int, cfg: TrainConfig) -> Dict[str, float]:
    """True entropy and the exact held-out NLL of each objective's model."""
    seqs = all_sequences()
    p = true_distribution(kind, seed)
    data = sample_data(p, n_train, seed)
    row = {"true": float(-(p * p.log()).sum())}
    for obj in OBJECTIVES:
        row[obj] = cross_entropy(train(obj, data, seqs, cfg), p, seqs)
    return row
