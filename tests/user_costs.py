"""Costs written as a user writes them, outside the package, for tests/test_user_costs.py:
named on the command line by import path (``--mrt-task-loss user_costs:LengthGap``, with
this folder on PYTHONPATH)."""
import torch

from fairseq_ext.core.task_losses import EmbeddingCost, TaskLoss


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


class ReferenceEmbedding(EmbeddingCost):
    """1 - cosine of the mean embeddings of the hypothesis and of its reference (ids) under a
    frozen random embedding; the references' embeddings come from ``prepare``, so MBR decoding
    with reference aggregation scores against their mean."""

    needs_reference = True
    input_kind = "ids"

    def __init__(self, vocab: int = 1000, dim: int = 8, seed: int = 0):
        self.embed = torch.nn.Embedding(vocab, dim)
        torch.nn.init.normal_(self.embed.weight, generator=torch.Generator().manual_seed(seed))
        self.embed.requires_grad_(False)

    def setup(self, device):
        self.embed.to(device).eval()

    def encode(self, ids):
        return self.embed(ids).mean(0)

    def prepare(self, refs, sources):
        return [self.encode(r) for r in refs]

    def batch_cost(self, hyps, refs, sources=None, prepared=None):
        h = torch.stack([self.encode(y) for y in hyps])
        r = torch.stack(list(prepared) if prepared is not None else [self.encode(y) for y in refs])
        return 1 - torch.nn.functional.cosine_similarity(h, r, dim=-1)


def not_a_cost(hyps, refs):
    return [0.0] * len(hyps)


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


class Recorder(TaskLoss):
    """Cost 0; appends each (hypothesis, reference, source) text it receives to the file
    $RECORD_COSTS as one JSON line: the strings a text cost sees."""

    needs_reference = True
    needs_source = True
    input_kind = "text"

    def sentence_cost(self, hyp, ref, source):
        import json
        import os

        with open(os.environ["RECORD_COSTS"], "a", encoding="utf-8") as f:
            f.write(json.dumps([hyp, ref, source]) + "\n")
        return 0.0
