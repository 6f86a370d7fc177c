"""Differentiable scheduled sampling's decoding passes (Goyal thesis 3.3.2): a target
decoded left to right, each position fed the gold token or the previous step's
relaxed decision, so that gradients flow back through every earlier decision; or
the parallel approximation in N teacher-forced passes.

The exact pass runs one loop over the step ``steps.build_step`` chooses: the
differentiable static-cache step where it covers the decoder, else fairseq's incremental
path (``fairseq_step.FairseqStep``, the decisions fed through the embedding hook); the
parallel passes are fairseq's full forward with the hook.
"""
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from fairseq_ext.core.constraints import Rule, check_arguments, declare
from fairseq_ext.core.relaxations import decision_embedding, gumbel_noise, is_sample
from fairseq_ext.decoding.soft_inputs import EmbeddingOverride, check_plain_output_layer, decoder_embedding
from fairseq_ext.decoding.steps import build_step

NoiseFn = Callable[[Tensor], Tensor]


def make_noise_fn(mode: str, generator: Optional[torch.Generator] = None) -> Optional[NoiseFn]:
    """Gumbel noise of the shape of given scores for the sample modes, else None."""
    if not is_sample(mode):
        return None
    return lambda scores: gumbel_noise(scores.shape, generator=generator, device=scores.device, dtype=torch.float32)


@declare(passes=Rule(lambda p: p == 0 or p >= 2, "0 (exact) or >= 2", counterexample=1))
def run_scheduled_sampling(
    model,
    net_input: Dict[str, Tensor],
    model_fed: Tensor,
    mode: str,
    alpha: float,
    passes: int = 0,
    noise_fn: Optional[NoiseFn] = None,
    path: str = "static-cache",
    compiled: bool = False,
) -> Tuple[Tensor, List[Tensor]]:
    """Decoder scores of a scheduled-sampling pass.

    net_input: a fairseq batch's ``net_input`` (``src_tokens``, ``src_lengths``,
    ``prev_output_tokens`` (N, T)). model_fed: (N, T) bool, True where position i
    is fed the decision on the scores of position i - 1 instead of the gold token
    ``prev_output_tokens[:, i]`` (must be False at i = 0 and at padding).

    passes = 0: exact, left to right through the incremental state; the decision
    at i is taken on the scores of step i - 1 of this very pass, so gradients flow
    back through every earlier decision (soft modes). passes = P >= 2: the
    parallel approximation: pass 1 is teacher-forced, pass p feeds the decisions
    on pass p - 1's scores; P full-sequence forwards instead of T incremental steps.

    path: ``static-cache``, the static-cache step where it covers the decoder; ``fairseq``,
    fairseq's incremental path (``steps.static_cache``); compiled: the exact pass's static-cache step compiled by ``torch.compile``
    (``compiled_step``).

    Returns the scores (N, T, V) the loss is computed on, and the per-step scores
    (T tensors (N, V)) the decisions were taken on in the exact mode (empty list
    for passes >= 2).
    """
    check_arguments(run_scheduled_sampling, passes=passes)
    if is_sample(mode) and noise_fn is None:
        raise ValueError(f"mode {mode!r} needs a noise_fn")
    decoder = model.decoder
    check_plain_output_layer(decoder)
    embedding = decoder_embedding(decoder)
    embed_weight = embedding.weight
    prev = net_input["prev_output_tokens"]
    encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input.get("src_lengths"))

    def decide(scores: Tensor) -> Tensor:
        noise = noise_fn(scores) if noise_fn is not None else None
        return decision_embedding(scores, embed_weight, mode, alpha, noise)

    if passes == 0:
        return _sequential(model, encoder_out, prev, model_fed, decide, path, compiled)
    with EmbeddingOverride(embedding) as override:
        logits, _ = decoder(prev, encoder_out=encoder_out)
        for _ in range(passes - 1):
            decided = decide(logits[:, :-1])
            override.set(model_fed, torch.cat([torch.zeros_like(decided[:, :1]), decided], dim=1))
            logits, _ = decoder(prev, encoder_out=encoder_out)
        return logits, []


def _sequential(model, encoder_out, prev: Tensor, model_fed: Tensor, decide, path: str,
                compiled: bool) -> Tuple[Tensor, List[Tensor]]:
    """The exact pass: position i fed the gold token, or where ``model_fed`` the decision on the
    scores of step i - 1, through the step ``steps.build_step`` chooses."""
    step = build_step(model, encoder_out, torch.arange(prev.size(0), device=prev.device), prev.size(1), path,
                      "scheduled sampling", differentiable=True, compiled=compiled)
    step_scores: List[Tensor] = []
    for i in range(prev.size(1)):
        embeds = replace = None
        if i > 0 and bool(model_fed[:, i].any()):
            embeds, replace = decide(step_scores[-1]), model_fed[:, i]
        step_scores.append(step.logits(prev[:, i], embeds, replace))
    return torch.stack(step_scores, dim=1), step_scores
