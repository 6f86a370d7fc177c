"""Fixed-length sampling and scoring with a fairseq decoder-only base LM, and the
joint sampler of the residual EBM (Deng et al., 2020, Algorithm 1).

Continuations have exactly L tokens: <eos> is an ordinary token of the stream
(lines are joined), so sampling does not stop at it, and ``lm_log_prob`` scores
the same untruncated distribution the samples come from (top-k filters only the
proposal, not the score).

The base LM's law is over the stream's symbols: <pad> and <s> never occur in a
token stream, so both the sampler and the scorer remove their mass and renormalise
(``stream_log_probs``), as fairseq's generator bans <pad>. With neither in a
history, fairseq's incremental decoding (the sampler) and its full forward (the
scorer) compute the same distribution; with them, they do not (the incremental path
neither masks an earlier <pad> as a key nor skips it when counting positions).
"""
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.core.constraints import at_least, check_arguments, declare
from fairseq_ext.core.residual_ebm import resample
from fairseq_ext.core.sampling import batch_generator, choose_tokens


def _with_bos(lm, tokens: Tensor) -> Tensor:
    eos = lm.decoder.dictionary.eos()
    return torch.cat([tokens.new_full((tokens.size(0), 1), eos), tokens], dim=1)


def stream_log_probs(lm, logits: Tensor) -> Tensor:
    """float32 log P_LM over the stream's symbols from decoder outputs (..., V): <pad>
    and <s> get -inf, the other symbols' probabilities are renormalised."""
    lprobs = lm.get_normalized_probs((logits,), log_probs=True).float()
    d = lm.decoder.dictionary
    lprobs[..., [d.pad(), d.bos()]] = float("-inf")
    return lprobs.log_softmax(-1)


@torch.no_grad()
def sample_continuations(lm, prefixes: Tensor, length: int, n: int, topk: int = 0,
                         generator: Optional[torch.Generator] = None) -> Tensor:
    """n ancestral samples of ``length`` tokens after every prefix (top-k when k > 0).

    lm: a fairseq decoder-only LM (``transformer_lm``); its input starts with <eos>
    as BOS, as in fairseq language modeling. prefixes: (B, P).
    Returns (B, n, length) LongTensor. Incremental decoding, as fairseq's
    SequenceGenerator runs it: the prompt is fed one token a step on the B prefixes
    (the decoder's cache filled once per prefix), the cache is then expanded to the
    B x n samples, and each sampled token costs one single-position step.
    """
    bsz = prefixes.size(0)
    prompt = _with_bos(lm, prefixes)  # (B, 1+P)
    state: Dict = {}
    for j in range(prompt.size(1)):
        logits = lm.decoder(prompt[:, : j + 1], incremental_state=state)[0]
    expand = torch.arange(bsz, device=prefixes.device).repeat_interleave(n)
    lm.decoder.reorder_incremental_state_scripting(state, expand)
    history = prompt.index_select(0, expand)  # (B*n, 1+P)
    logits = logits.index_select(0, expand)
    for t in range(length):
        if t > 0:
            logits = lm.decoder(history, incremental_state=state)[0]
        lprobs = stream_log_probs(lm, logits[:, -1])
        history = torch.cat([history, choose_tokens(lprobs, True, topk=topk, generator=generator)[:, None]], 1)
    return history[:, -length:].view(bsz, n, length)


@torch.no_grad()
def lm_log_prob(lm, sequences: Tensor, prefix_len: int) -> Tensor:
    """log P_LM(x_{p+1..T} | x_{1..p}) of (N, T) sequences, teacher-forced (the
    output projection only at the continuation's positions), over the stream's
    symbols (``stream_log_probs``): returns (N, T - p) per-token log-probabilities
    (sum them for the sequence)."""
    inputs = _with_bos(lm, sequences[:, :-1])
    features = lm.decoder.extract_features(inputs, None)[0][:, prefix_len:]  # the positions predicting x_{p+1..T}
    lprobs = stream_log_probs(lm, lm.decoder.output_layer(features))
    return lprobs.gather(2, sequences[:, prefix_len:, None]).squeeze(2)


def with_prefixes(prefixes: Tensor, conts: Tensor) -> Tensor:
    """(B, P) prefixes and (B, n, L) continuations -> (B*n, P+L) whole sequences,
    the n of a prefix consecutive."""
    bsz, n, _ = conts.shape
    return torch.cat([prefixes[:, None, :].expand(-1, n, -1), conts], dim=2).view(bsz * n, -1)


def energies_in_batches(energy_fn: Callable[[Tensor], Tensor], sequences: Tensor, batch_size: int) -> Tensor:
    """E of (N, T) sequences, ``batch_size`` rows per call; returns (N,)."""
    return torch.cat([energy_fn(chunk) for chunk in sequences.split(batch_size)])


@declare(n=at_least(1), num_outputs=at_least(1))
class JointSampler:
    """Algorithm 1: per prefix, n continuations from the base LM (top-k when k > 0),
    their energies in batches, then ``num_outputs`` picks in proportion to exp(-E)
    (independently, with replacement, from the same n samples).

    ``generate(models, sample)`` returns, per prefix, ``num_outputs`` hypotheses
    in fairseq-generate's format: ``tokens`` the continuation (L,), ``score`` -E,
    ``positional_scores`` the base LM's token log-probabilities, ``energy``;
    ``propose(energy_model, prefixes)`` its first two steps, all n proposals and
    their energies (scripts/score/eval_residual.py resamples from them itself).
    """

    def __init__(self, base_lm, length: int, n: int, topk: int = 0, num_outputs: int = 1,
                 energy_batch_size: int = 64, generator: Optional[torch.Generator] = None, seed: int = 1):
        check_arguments(JointSampler, n=n, num_outputs=num_outputs)
        self.base_lm, self.length, self.n, self.topk = base_lm, length, n, topk
        self.num_outputs, self.energy_batch_size, self.generator = num_outputs, energy_batch_size, generator
        self.seed = seed
        self.eos = base_lm.decoder.dictionary.eos()  # fairseq-generate strips it from the printed text

    @torch.no_grad()
    def propose(self, energy_model: Callable[[Tensor], Tensor], prefixes: Tensor,
                generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
        """Algorithm 1's proposals: n base-LM continuations of each of the (B, P)
        prefixes (drawn with ``generator``, else the sampler's own) and their
        energies. Returns conts (B, n, L) and energy (B, n)."""
        conts = sample_continuations(self.base_lm.to(prefixes.device), prefixes, self.length, self.n, self.topk,
                                     generator or self.generator)
        energy = energies_in_batches(energy_model, with_prefixes(prefixes, conts), self.energy_batch_size)
        return conts, energy.view(prefixes.size(0), self.n)

    @torch.no_grad()
    def generate(self, models, sample: Dict, **kwargs) -> List[List[Dict]]:
        if len(models) != 1:
            raise ConfigError("the joint sampler takes one energy model (no ensembles)")
        prefixes = sample["net_input"]["src_tokens"]
        bsz, p = prefixes.shape
        # without a generator of its own: one per batch from the ids, the same draws in any shard
        gen = self.generator or batch_generator(self.seed, sample["id"].to(prefixes.device))
        conts, energy = self.propose(models[0], prefixes, gen)
        picks = resample(energy, self.num_outputs, generator=gen)
        lp = lm_log_prob(self.base_lm, with_prefixes(prefixes, conts), p).view(bsz, self.n, self.length)
        out = []
        for b in range(bsz):
            out.append([{"tokens": conts[b, i], "score": -energy[b, i], "energy": energy[b, i],
                         "positional_scores": lp[b, i], "alignment": None} for i in picks[b].tolist()])
        return out
