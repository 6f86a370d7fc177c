"""From a fairseq batch to decoded candidates: ``decode_batch``, the one entry point the
criterions (MGS, MRT, PG), the MBR generator and the tagging task's evaluation decode
through. It unwraps a data-parallel model, turns a ``text_completion`` batch (prompts in
``sample["prefix"]``) into what the decoder continues (``decode_inputs``), and runs
``candidates.decode_candidates``, or its one-pass forms: one greedy candidate per input
beside the ``cfg`` candidates (``with_greedy``), or G parameter sets decoded together
(``sets``). Scoring the candidates is the caller's (``costs``)."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from fairseq_ext.decoding.candidates import (Candidates, DecodeConfig, ParameterSets, decode_candidates,
                                             decode_grouped, decode_with_greedy, prefix_sample)
from fairseq_ext.runtime.distributed import unwrap


@dataclass
class Decoded:
    """What ``decode_batch`` returns.

    candidates: the ``cfg`` candidates (with ``sets``: parameter set 0's).
    batch: the batch as the decoder saw it (a completion batch: the prompt as the source,
        the reference continuation as the target), which costs score against.
    greedy: one greedy candidate per input (``with_greedy``), else None.
    groups: one ``Candidates`` per parameter set (``sets``), else ``[candidates]``.
    """

    candidates: Candidates
    batch: Dict
    greedy: Optional[Candidates] = None
    groups: Optional[List[Candidates]] = None

    def __post_init__(self) -> None:
        if self.groups is None:
            self.groups = [self.candidates]


def decode_inputs(sample: Dict, dictionary) -> Tuple[Dict, Optional[Tensor]]:
    """(the batch as the decoder sees it, the prompt tokens it continues or None)."""
    if "prefix" in sample:
        return prefix_sample(sample, dictionary.pad(), dictionary.eos()), sample["prefix"]
    return sample, None


def decode_batch(model, sample: Dict, cfg: DecodeConfig,
                 generator: Union[None, torch.Generator, Sequence[torch.Generator]] = None, *,
                 with_greedy: bool = False, sets: Optional[ParameterSets] = None) -> Decoded:
    """Decode ``cfg``'s candidates for every input of a fairseq batch.

    generator: the sampling generator (``sets``: one per parameter set).
    with_greedy: also one greedy candidate per input, in the same pass where the static-cache
        step runs (``candidates.decode_with_greedy``).
    sets: decode once per parameter set, together (``candidates.decode_grouped``).
    """
    module = unwrap(model)
    batch, prefix = decode_inputs(sample, module.decoder.dictionary) if "prefix" in sample else (sample, None)
    if sets is not None:
        groups = decode_grouped(module, batch, cfg, sets, prefix_tokens=prefix, generators=generator)
        return Decoded(groups[0], batch, groups=groups)
    if with_greedy:
        cand, greedy = decode_with_greedy(module, batch, cfg, prefix_tokens=prefix, generator=generator)
        return Decoded(cand, batch, greedy=greedy)
    return Decoded(decode_candidates(module, batch, cfg, prefix_tokens=prefix, generator=generator), batch)
