"""A stand-in for the ``unbabel-comet`` package with the interface the plugin uses
(``download_model``, ``load_from_checkpoint``, a model whose ``predict`` returns ``.scores``,
and the pieces of COMET's regression models that reference aggregation reads:
``encoder.prepare_sample``, ``get_sentence_embedding``, ``estimate``), built locally: a tiny
frozen torch model, so that the ``comet`` cost runs end to end without a download.

As in COMET's regression models, ``predict`` is ``estimate`` on the sentence embeddings of
the source, the hypothesis and the reference. A sentence's embedding is its bag of words,
hashed into BUCKETS counts (an EmbeddingBag with one-hot rows: a real torch forward). The
estimate is overlap / (1 + |len(mt) - len(src)| / 10), where overlap is the share of the
reference's words whose bucket occurs in the hypothesis (for a mean of reference
embeddings: the mean counts, weighted alike). ``score`` computes the same rule for one
sample in plain Python. A path naming "kiwi" loads a quality-estimation model (CometKiwi's
interface: ``is_referenceless()`` True, samples of source and hypothesis only, a sample with a
"ref" refused), whose score is 1 / (1 + |len(mt) - len(src)| / 10) (``qe_score``). Every call is appended to $COMET_STAND_IN_LOG as one JSON line: the
model name or path it was given, and for ``predict`` the samples, batch size, device
arguments and scores; for ``get_sentence_embedding`` the number of sentences."""
import json
import os
import types
import zlib

import torch

BUCKETS = 256  # bucket 0 is padding


def _log(record):
    path = os.environ.get("COMET_STAND_IN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def download_model(model, saving_directory=None):
    _log({"call": "download_model", "model": model})
    return f"/stand-in/{model}/checkpoints/model.ckpt"


def bucket(word):
    return 1 + zlib.crc32(word.encode()) % (BUCKETS - 1)


def score(sample):
    """The stand-in's score of one sample (the rule the model computes), in plain Python."""
    mt, ref, src = sample["mt"].split(), sample["ref"].split(), sample["src"].split()
    in_mt = {bucket(w) for w in mt}
    overlap = sum(bucket(w) in in_mt for w in ref) / max(len(ref), 1)
    return overlap / (1 + abs(len(mt) - len(src)) / 10)


def qe_score(sample):
    """The stand-in QE model's score of one sample (source and hypothesis), in plain Python."""
    return 1 / (1 + abs(len(sample["mt"].split()) - len(sample["src"].split())) / 10)


class _Encoder:
    def prepare_sample(self, sample, word_level=False, annotations=None):
        ids = [[bucket(w) for w in s.split()] or [0] for s in sample]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([x + [0] * (width - len(x)) for x in ids], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}


class _Model(torch.nn.Module):
    def __init__(self, path):
        super().__init__()
        self.path = path
        self.encoder = _Encoder()
        self.table = torch.nn.EmbeddingBag(BUCKETS, BUCKETS, mode="sum")
        with torch.no_grad():
            self.table.weight.copy_(torch.eye(BUCKETS))

    def get_sentence_embedding(self, input_ids, attention_mask, token_type_ids=None):
        _log({"call": "get_sentence_embedding", "n": int(input_ids.shape[0]), "grad": torch.is_grad_enabled()})
        out = self.table(input_ids, per_sample_weights=attention_mask.to(self.table.weight.dtype))
        out[:, 0] = 0.0
        return out

    def estimate(self, src_sentemb, mt_sentemb, ref_sentemb):
        overlap = (ref_sentemb * (mt_sentemb > 0)).sum(-1) / ref_sentemb.sum(-1).clamp(min=1.0)
        return {"score": overlap / (1 + (mt_sentemb.sum(-1) - src_sentemb.sum(-1)).abs() / 10)}

    def _embed(self, texts):
        batch = self.encoder.prepare_sample(texts)
        return self.get_sentence_embedding(**batch)

    def is_referenceless(self):
        return False

    def predict(self, samples, batch_size=16, gpus=1, progress_bar=True, devices=None, **kwargs):
        with torch.no_grad():
            out = self.estimate(*(self._embed([s[k] for s in samples]) for k in ("src", "mt", "ref")))
        scores = [float(x) for x in out["score"]]
        _log({"call": "predict", "path": self.path, "n": len(samples), "batch_size": batch_size, "gpus": gpus,
              "devices": devices, "training": self.training, "grad": torch.is_grad_enabled(),
              "samples": samples, "scores": scores})
        return types.SimpleNamespace(scores=scores, system_score=sum(scores) / max(len(scores), 1))


class _UnifiedModel(torch.nn.Module):
    """Like COMET's unified models (XCOMET): ``predict`` only, no estimator over sentence
    embeddings; the same scores as ``_Model``."""

    def __init__(self, path):
        super().__init__()
        self.inner = _Model(path)

    def predict(self, *args, **kwargs):
        return self.inner.predict(*args, **kwargs)


class _QEModel(torch.nn.Module):
    """Like CometKiwi: reads the source and the hypothesis, never a reference."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.scale = torch.nn.Parameter(torch.ones(1), requires_grad=False)

    def is_referenceless(self):
        return True

    def predict(self, samples, batch_size=16, gpus=1, progress_bar=True, devices=None, **kwargs):
        if any(set(s) != {"src", "mt"} for s in samples):
            raise ValueError(f"a quality-estimation model reads src and mt only, got {sorted(samples[0])}")
        with torch.no_grad():
            gap = torch.tensor([abs(len(s["mt"].split()) - len(s["src"].split())) for s in samples], dtype=torch.float)
            scores = (self.scale / (1 + gap / 10)).tolist()
        _log({"call": "predict", "path": self.path, "n": len(samples), "batch_size": batch_size, "gpus": gpus,
              "devices": devices, "training": self.training, "grad": torch.is_grad_enabled(),
              "samples": samples, "scores": scores})
        return types.SimpleNamespace(scores=scores, system_score=sum(scores) / max(len(scores), 1))


def load_from_checkpoint(checkpoint_path, **kwargs):
    """A path naming "xcomet" loads a model without an estimator (as COMET's unified models), one
    naming "kiwi" a quality-estimation model."""
    _log({"call": "load_from_checkpoint", "path": checkpoint_path})
    if "kiwi" in checkpoint_path:
        return _QEModel(checkpoint_path)
    return (_UnifiedModel if "xcomet" in checkpoint_path else _Model)(checkpoint_path)
