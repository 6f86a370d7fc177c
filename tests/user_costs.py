"""Costs written as a user writes them, outside the package, for tests/test_user_costs.py:
named on the command line by import path (``--mrt-task-loss user_costs:LengthGap``, with
this folder on PYTHONPATH)."""
import os

import torch

from fairseq_ext.core.task_losses import TaskLoss


class LengthGap(TaskLoss):
    """|words of the hypothesis - words of the source| / 10: reads the source, as text."""

    needs_reference = False
    needs_source = True
    input_kind = "text"

    def sentence_cost(self, hyp, ref, source):
        return abs(len(hyp.split()) - len(source.split())) / 10


class SourceWords(TaskLoss):
    """The number of words of the hypothesis's source, whatever the hypothesis: which source
    reached which hypothesis, and a reference-free cost of the source kind "tokens"."""

    needs_reference = False
    needs_source = True
    input_kind = "text"
    source_kind = "tokens"

    def sentence_cost(self, hyp, ref, source):
        return float(len(source))


class EmbeddingDistance(TaskLoss):
    """A small neural, source-aware cost: 1 - cosine of the mean embeddings of the hypothesis
    and of the source under a frozen random embedding (ids of a shared vocabulary); the
    sources' encodings come from ``prepare``, once per batch. Records what it was given."""

    needs_reference = False
    needs_source = True
    input_kind = "ids"
    batch_size = 3

    def __init__(self, vocab: int = 1000, dim: int = 8, seed: int = 0):
        self.embed = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.embed.weight, generator=torch.Generator().manual_seed(seed))
        self.embed.requires_grad_(False)
        self.calls = {"setup": 0, "prepare": 0, "chunks": [], "grad": []}

    def setup(self, device):
        self.calls["setup"] += 1
        self.embed.to(device).eval()

    def encode(self, ids):
        return self.embed(ids).mean(0)

    def prepare(self, refs, sources):
        self.calls["prepare"] += 1
        return [self.encode(x) for x in sources]

    def batch_cost(self, hyps, refs, sources=None, prepared=None):
        self.calls["chunks"].append(len(hyps))
        self.calls["grad"].append(torch.is_grad_enabled())
        h = torch.stack([self.encode(y) for y in hyps])
        x = torch.stack(list(prepared))
        return 1 - torch.nn.functional.cosine_similarity(h, x, dim=-1)


def not_a_cost(hyps, refs):
    return [0.0] * len(hyps)


class FrozenModelNLL(TaskLoss):
    """-log p(hypothesis | source) under a frozen fairseq model, summed over the hypothesis's
    tokens (EOS included): a neural, source-aware cost as a user writes one for a scorer of
    their own (Prism- or BARTScore-style). The checkpoint is $USER_COSTS_SCORER. Works for a
    decoder-only scorer (the source is the prefix the hypothesis continues) and for an
    encoder-decoder one, whose encoder runs once per batch on the sources (``prepare``)."""

    needs_reference = False
    needs_source = True
    input_kind = "ids"
    batch_size = 64

    def __init__(self):
        from fairseq import checkpoint_utils

        models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([os.environ["USER_COSTS_SCORER"]])
        self.model, self.dictionary = models[0].eval(), task.target_dictionary
        self.model.requires_grad_(False)

    def setup(self, device):
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


class OnItsOwnDevice(TaskLoss):
    """Names its own device ("meta": not the training device, and no data lives there): the
    number of ids of each hypothesis, and where its set-up and hypotheses were."""

    needs_reference = False
    input_kind = "ids"
    device = "meta"
    seen = {"setup": [], "hyps": set()}

    def setup(self, device):
        self.seen["setup"].append(device)

    def batch_cost(self, hyps, refs):
        self.seen["hyps"].update(h.device for h in hyps)
        return [float(h.numel()) for h in hyps]


class NowhereDevice(TaskLoss):
    needs_reference = False
    device = "nowhere"
