"""Token-level choice rules for candidate decoding: greedy, top-k, nucleus (top-p) and
epsilon sampling with temperature; seeds mixed from integers and per-batch random
generators. Pure PyTorch, shapes in the docstrings."""
from typing import Optional

import torch
from torch import Tensor

from fairseq_ext.core.constraints import above, at_least, between, check_arguments, declare

_MASK63 = (1 << 63) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64-style mixing; deterministic across runs)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h ^= (int(p) + 0x9E3779B97F4A7C15 + ((h << 6) & _MASK63) + (h >> 2)) & _MASK63
        h = (h * 0xBF58476D1CE4E5B9) & _MASK63
        h ^= h >> 31
    return h & _MASK63


def batch_generator(seed: int, ids: Tensor) -> torch.Generator:
    """A generator on ``ids``' device seeded by ``seed`` and the batch's example ids
    (in any order): a batch draws the same numbers whatever its position in the run,
    so ``fairseq-generate --num-shards N --shard-id i`` (which deals out the same
    batches as one run) gives, shard by shard, exactly the samples of one run."""
    gen = torch.Generator(device=ids.device)
    gen.manual_seed(mix_seed(seed, *sorted(ids.view(-1).tolist())))
    return gen


@declare(topk=at_least(0), topp=between(0, 1, low_open=True), epsilon=between(0, 1, low_open=True, high_open=True))
def filter_logits(logits: Tensor, topk: int = 0, topp: float = 1.0, epsilon: Optional[float] = None) -> Tensor:
    """Mask (set to -inf) the logits outside the top-k, the top-p nucleus and, with
    ``epsilon``, the tokens of probability below epsilon.

    logits: (N, V) unnormalised or log-probabilities. ``topk <= 0``, ``topp >= 1`` and
    ``epsilon`` None disable the respective filter. The nucleus is the smallest set of
    most probable tokens whose probability reaches ``topp`` (Holtzman et al., 2020);
    epsilon sampling (Hewitt et al., 2022) keeps the tokens of probability >= epsilon
    under softmax(logits). The most probable token is always kept. Returns a tensor of
    the same shape.
    """
    check_arguments(filter_logits, topk=topk, topp=topp, epsilon=epsilon)
    out = logits
    if epsilon is not None:
        probs = torch.softmax(out.float(), dim=-1)
        drop = probs < epsilon
        drop.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)
        out = out.masked_fill(drop, float("-inf"))
    if 0 < topk < logits.size(-1):
        kth = torch.topk(out, topk, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if topp < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # mass strictly before each token; a token is dropped once that mass >= topp
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= topp
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


@declare(temperature=above(0))
def choose_tokens(
    logits: Tensor,
    sample: bool,
    temperature: float = 1.0,
    topk: int = 0,
    topp: float = 1.0,
    generator: Optional[torch.Generator] = None,
    epsilon: Optional[float] = None,
) -> Tensor:
    """Pick one token per row of ``logits`` (N, V): argmax, or a draw from
    softmax(filter(logits / temperature)) (``filter_logits``: the filters apply to the
    tempered distribution). Returns (N,) LongTensor."""
    if not sample:
        return logits.argmax(dim=-1)
    check_arguments(choose_tokens, temperature=temperature)
    filtered = filter_logits(logits.float() / temperature, topk=topk, topp=topp, epsilon=epsilon)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
