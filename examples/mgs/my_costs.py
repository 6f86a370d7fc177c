"""Your own metric as the task loss of MGS, MRT and PG: two costs to copy.

Name a class by import path, with this folder on PYTHONPATH:

    PYTHONPATH=examples/mgs fairseq-train ... --criterion mrt --mrt-task-loss my_costs:LengthGap=1,sbleu=0.5

``LengthGap`` runs anywhere (it is what docs/task_losses.md shows);
``EmbeddingSimilarity`` is a small neural, source-aware cost that runs anywhere too (a
template for your own encoder: set-up on a device, sources encoded once per batch,
batched evaluation); ``FrozenModelNLL`` scores hypotheses with a fairseq checkpoint of
your own (``SCORER_CHECKPOINT=scorer.pt``). COMET is a registered cost of the package,
``--mrt-task-loss 'comet(model=Unbabel/wmt22-comet-da)'`` (docs/task_losses.md).
"""
import os
import zlib
from typing import List, Optional

import torch

from fairseq_ext.core.task_losses import TaskLoss


class LengthGap(TaskLoss):
    """|words(hypothesis) - words(source)| / 10: a cost that reads the source."""

    needs_reference = False  # references are not passed
    needs_source = True  # the source of each hypothesis comes beside it
    input_kind = "text"  # hypotheses and sources as detokenized text

    def sentence_cost(self, hyp: str, ref: Optional[str], source: str) -> float:
        return abs(len(hyp.split()) - len(source.split())) / 10


class EmbeddingSimilarity(TaskLoss):
    """1 - cosine(mean word embedding of the hypothesis, mean word embedding of its source).

    A small neural, source-aware cost with the shape of a learned metric: a frozen encoder
    (here a table of random word vectors, words hashed into its rows, so that it runs on any
    vocabulary without a download; put a trained cross-lingual encoder in its place), the
    sources encoded once per batch in ``prepare`` and reused for every candidate set, the
    hypotheses encoded ``batch_size`` at a time on the device ``setup`` names (the training
    device; set ``device = "cpu"`` to keep a cost off the GPU). Costs lie in [0, 2].
    """

    needs_reference = False
    needs_source = True
    input_kind = "text"
    batch_size = 256

    def __init__(self, dim: int = 32, rows: int = 4096, seed: int = 0) -> None:
        self.rows = rows
        self.table = torch.nn.EmbeddingBag(rows, dim, mode="mean")
        torch.nn.init.normal_(self.table.weight, generator=torch.Generator().manual_seed(seed))
        self.table.requires_grad_(False)

    def setup(self, device: torch.device) -> None:
        self.table.to(device).eval()

    def encode(self, sentences: List[str]) -> torch.Tensor:
        """(B, dim) mean vectors of the sentences' words (zeros for an empty sentence)."""
        device = self.table.weight.device
        ids = [[zlib.crc32(w.encode()) % self.rows for w in s.split()] for s in sentences]
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long, device=device)
        offsets = torch.tensor([0] + [len(row) for row in ids[:-1]], device=device).cumsum(0)
        return self.table(flat, offsets)

    def prepare(self, refs, sources: List[str]) -> List[torch.Tensor]:
        return list(self.encode(sources))

    def batch_cost(self, hyps: List[str], refs, sources: List[str], prepared: List[torch.Tensor]) -> torch.Tensor:
        return 1 - torch.nn.functional.cosine_similarity(self.encode(hyps), torch.stack(prepared), dim=-1)


class FrozenModelNLL(TaskLoss):
    """-log p(hypothesis | source) under a frozen fairseq model, summed over the hypothesis's
    tokens (EOS included): a scorer of your own as the cost (Prism- or BARTScore-style).

    The checkpoint is $SCORER_CHECKPOINT; its dictionary must be the trained model's. A
    decoder-only scorer (``transformer_lm``, task ``text_completion``) reads the prefix the
    hypothesis continues; an encoder-decoder one (``transformer``, ``lstm``) reads the source
    sentence, encoded once per batch (``prepare``) and reused for every candidate set. The
    sum rewards short outputs as well as likely ones: mix it with another cost, or divide by
    the length, where that matters.
    """

    needs_reference = False
    needs_source = True
    input_kind = "ids"
    batch_size = 64

    def __init__(self, checkpoint: Optional[str] = None) -> None:
        from fairseq import checkpoint_utils

        path = checkpoint or os.environ.get("SCORER_CHECKPOINT")
        if not path:
            raise ValueError("FrozenModelNLL: set SCORER_CHECKPOINT to the scorer's checkpoint")
        models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([path])
        self.model, self.dictionary = models[0], task.target_dictionary
        self.model.eval().requires_grad_(False)

    def setup(self, device: torch.device) -> None:
        self.model.to(device)

    def prepare(self, refs, sources):
        if getattr(self.model, "encoder", None) is None:
            return None
        return [self.model.encoder(x.unsqueeze(0), src_lengths=torch.tensor([len(x)], device=x.device))
                for x in sources]

    def batch_cost(self, hyps, refs, sources, prepared=None):
        eos = self.dictionary.eos()
        out = []
        for i, (y, x) in enumerate(zip(hyps, sources)):  # one sequence at a time: nothing to pad
            if prepared is None:  # decoder-only: [eos] + prefix + hypothesis, scored after the prefix
                tokens = torch.cat([x.new_tensor([eos]), x, y])
                logits = self.model(tokens[:-1].unsqueeze(0))[0][0, len(x):]
            else:
                inputs = torch.cat([y.new_tensor([eos]), y[:-1]])
                logits = self.model.decoder(inputs.unsqueeze(0), encoder_out=prepared[i])[0][0]
            out.append(-logits.float().log_softmax(-1).gather(-1, y.unsqueeze(-1)).sum())
        return torch.stack(out)
