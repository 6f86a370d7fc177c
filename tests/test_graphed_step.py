"""Candidate decoding replayed from a recording of the step (fairseq_ext/decoding/
graphed_step.py), on the CPU: a CUDA graph's semantics emulated by tracing the step's
operators once (``make_fx``) and replaying the trace, so that whatever a CUDA graph would
freeze (Python numbers, the tensors the step read while it was recorded) is frozen here
too. A step that kept its position in Python, or replaced a state tensor instead of
writing it, decodes wrongly when replayed.

- greedy, sampled (top-k, top-p, min_len, forced prefixes) and grouped candidates
  replayed equal the eager step's, for `transformer` (two variants, random and trained),
  `lstm` (two variants), `transformer_lm` and `lstm_lm`, also where rows finish early and
  leave the caches (each compaction records again);
- the automatic fallback: a recording that fails, or a first replay that differs from
  the eager step, is said once in the log and decoding goes on eagerly, with the eager
  step's results.
The same decodes on a CUDA device, with real CUDA graphs: tests/test_gpu.py.
"""
import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fairseq_ext.decoding import graphed_step
from fairseq_ext.decoding.candidates import DecodeConfig, decode_candidates, decode_grouped
from fairseq_ext.decoding.paths import decoder_step
from fairseq_ext.costs.batch_scorer import BatchScorer
from test_lean_step import (CONFIGS, _batch, _count_reorders, _eos_biased, _parameter_sets,  # noqa: F401
                            language_model, lstm_language_model, translation)


class TracedRecorder:
    """CUDA graph semantics on the CPU (module docstring); recording leaves the step's state
    as it was, as recording a CUDA graph runs nothing. ``fail``: recording raises it;
    ``skew``: replays add it to the logits (a replay that differs from the eager step)."""

    def __init__(self, fail=None, skew=0.0):
        self.fail, self.skew = fail, skew
        self.recordings = self.replays = self.warm_ups = 0

    def warm(self, fn):
        self.warm_ups += 1
        return fn()

    def record(self, fn, example, state):
        self.recordings += 1
        if self.fail is not None:
            raise self.fail
        saved = [t.clone() for t in state]
        traced = make_fx(lambda tokens: fn(tokens))(example.clone())
        for t, value in zip(state, saved):
            t.copy_(value)

        def replay(tokens):
            self.replays += 1
            return traced(tokens.clone()) + self.skew
        return replay


@pytest.fixture
def recorder(monkeypatch):
    """Candidate decoding records its steps with a ``TracedRecorder`` (returned), the first
    replay of the test checked against the eager step, the log's once-only lines reset."""
    made = TracedRecorder()
    monkeypatch.setattr(graphed_step, "recorder_for", lambda device: made)
    monkeypatch.setattr(graphed_step.GraphedStep, "verified", set())
    monkeypatch.setattr(graphed_step.GraphedStep, "failed", set())
    monkeypatch.setattr(graphed_step, "_LOGGED", set())
    return made


def _decode(task, model, cfg, graphs, n=12):
    sample = _batch(task, n)
    batch, prefix = BatchScorer(task, "edit").decode_inputs(sample, task.target_dictionary)
    return decode_candidates(model, batch, DecodeConfig(max_len_b=12, cuda_graphs=graphs, **cfg), prefix_tokens=prefix,
                             generator=torch.Generator().manual_seed(3))


def _same(got, want):
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.lengths, want.lengths)
    assert torch.equal(got.finished, want.finished)
    assert (got.scores - want.scores).abs().max().item() < 1e-5


def _replayed_equals_eager(task, model, recorder, monkeypatch, eos_bias):
    kept = _count_reorders(monkeypatch)
    model = _eos_biased(model, task, eos_bias)
    for cfg in CONFIGS:
        recordings, replays, reorders = recorder.recordings, recorder.replays, len(kept)
        _same(_decode(task, model, cfg, "auto"), _decode(task, model, cfg, "off"))
        # at most one recording per decode and per compaction (the graphed decode's compactions are
        # half of those counted: the eager decode makes the same; none after the decode's last step)
        assert 1 <= recorder.recordings - recordings <= 1 + (len(kept) - reorders) // 2
        assert recorder.replays - replays > 0
        assert not graphed_step.GraphedStep.failed  # no recording fell back
    assert graphed_step.GraphedStep.verified
    if eos_bias:
        assert kept, "no compaction happened"


@pytest.mark.parametrize("eos_bias", [0.0, 3.0])
def test_replayed_candidates_equal_the_eager_steps_of_a_translation_model(translation, recorder, monkeypatch, eos_bias):
    """Greedy and sampled candidates with the step replayed: the eager step's tokens,
    lengths, finished flags and scores (EOS bias 3: rows finish at different steps and
    leave the caches, after which the step is recorded again)."""
    task, model = translation
    _replayed_equals_eager(task, model, recorder, monkeypatch, eos_bias)


@pytest.mark.parametrize("which", ["transformer_lm", "lstm_lm"])
def test_replayed_candidates_equal_the_eager_steps_of_a_language_model(language_model, lstm_language_model, recorder,
                                                                       monkeypatch, which):
    task, model = language_model if which == "transformer_lm" else lstm_language_model
    _replayed_equals_eager(task, model, recorder, monkeypatch, 3.0)


def test_replayed_grouped_candidates_equal_the_eager_steps(translation, recorder):
    """MGS's grouped decode (four parameter sets stepped together), greedy and sampled."""
    task, model = translation
    sample = _batch(task, 12)
    batch, prefix = BatchScorer(task, "edit").decode_inputs(sample, task.target_dictionary)
    model = _eos_biased(model, task, 2.0)
    sets, _ = _parameter_sets(model, 4)
    for cfg in (dict(), dict(strategy="sample", num_candidates=2, topk=10)):
        got, want = [decode_grouped(model, batch, DecodeConfig(max_len_b=12, cuda_graphs=graphs, **cfg), sets,
                                    prefix_tokens=prefix,
                                    generators=[torch.Generator().manual_seed(7) for _ in range(4)] if cfg else None)
                     for graphs in ("auto", "off")]
        for a, b in zip(got, want):
            _same(a, b)
    assert recorder.replays > 0


def test_a_recording_that_fails_decodes_eagerly_with_one_log_line(translation, recorder, caplog):
    task, model = translation
    recorder.fail = RuntimeError("operation not permitted when stream is capturing\nmore detail")
    with caplog.at_level(logging.INFO, logger="fairseq_ext.decoding.graphed_step"):
        for cfg in CONFIGS[:2]:
            _same(_decode(task, model, cfg, "auto"), _decode(task, model, cfg, "off"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["candidate decoding: recording the decoder step in a CUDA graph failed (RuntimeError: operation "
                     "not permitted when stream is capturing); decoding without CUDA graphs from now on"]
    assert recorder.recordings == 1 and recorder.replays == 0  # not tried again for this kind of step


def test_a_replay_that_differs_from_the_eager_step_decodes_eagerly_with_one_log_line(translation, recorder, caplog):
    task, model = translation
    recorder.skew = 1e-3
    with caplog.at_level(logging.INFO, logger="fairseq_ext.decoding.graphed_step"):
        _same(_decode(task, model, {}, "auto"), _decode(task, model, {}, "off"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "differs from the eager step (logits: max difference 0.001" in lines[0], lines
    assert recorder.replays == 1 and not graphed_step.GraphedStep.verified


def test_cuda_graphs_off_never_records_and_a_plain_step_is_refused(translation, monkeypatch):
    task, model = translation
    made = TracedRecorder()
    monkeypatch.setattr(graphed_step, "recorder_for", lambda device: made)
    _decode(task, model, {}, "off")
    assert made.recordings == 0 and made.warm_ups == 0
    sample = _batch(task, 2)
    with torch.no_grad():
        plain = decoder_step(model, model.encoder.forward_torchscript(sample["net_input"]), torch.arange(2), 3)
    with pytest.raises(ValueError, match="capturable"):
        graphed_step.GraphedStep(plain, made, 3)


def test_the_cpu_records_nothing():
    assert graphed_step.recorder_for(torch.device("cpu")) is None
