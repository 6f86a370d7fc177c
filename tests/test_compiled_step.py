"""The steps decoded under gradients compiled by torch.compile (``decoding/compiled_step``):
with ``--dss-compile on`` scheduled sampling's exact pass, and with ``--soft-beam-compile on``
the soft beam's search, give the eager steps' loss, scores and every parameter's gradient
(fairseq's transformer and lstm), over batches of two sizes, positions fed the gold token or
the soft decision, and sentences leaving the search; the traces are a few, whatever the
number of positions; a compiler that fails leaves one log line and the eager results.

The fast tests compile with the compiler's tracing only (a backend that runs the traced
graphs as they are, and counts them); the slow ones with ``aot_eager`` (tracing,
functionalisation and autograd, without code generation) in float64, and with inductor,
the default, in float32."""
import logging

import pytest
import torch

from fairseq_ext.criterions.scheduled_sampling import DSSCriterion
from fairseq_ext.criterions.soft_beam import SoftBeamDirectLossCriterion
from fairseq_ext.runtime.cli import ConfigError
from fairseq_ext.decoding import compiled_step
from fairseq_ext.decoding.dss_passes import run_scheduled_sampling
from fairseq_ext.core.token_losses import label_smoothed_nll
from fairseq_ext.synthetic import tiny_models


@pytest.fixture
def backend(monkeypatch):
    """Sets compiled_step's backend; the process's compiled functions and failures are the test's own."""
    monkeypatch.setattr(compiled_step, "_compiled", {})
    monkeypatch.setattr(compiled_step, "_failed", {})

    def use(name):
        monkeypatch.setattr(compiled_step, "BACKEND", name)
    return use


@pytest.fixture(scope="module")
def models(toy_bin):
    """(task, model, valid set) of fairseq's transformer (2 decoder layers) and lstm."""
    out = {}
    for arch, extra in (("transformer", ["--decoder-layers", "2"]), ("lstm", [])):
        task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", arch, extra)
        task.load_dataset("valid")
        out[arch] = (task, model, task.dataset("valid"))
    return out


@pytest.fixture(scope="module")
def transformer(models):
    return models["transformer"]


def _batch(ds, n):
    sample = ds.collater([ds[i] for i in range(n)])
    prev = sample["net_input"]["prev_output_tokens"]
    gen = torch.Generator().manual_seed(n)
    fed = (torch.rand(prev.shape, generator=gen) < 0.7) & prev.ne(1)
    fed[:, 0] = False
    fed[:, 1] = False  # one position after the first fed the gold token in every row: embeds None there
    return sample, fed


def _pass(model, sample, fed, compiled):
    """Scores and every parameter's gradient of the exact soft-argmax pass's loss."""
    model.zero_grad(set_to_none=True)
    logits, _ = run_scheduled_sampling(model, sample["net_input"], fed, "soft-argmax", 1.0, 0, compiled=compiled)
    lprobs = model.get_normalized_probs((logits, None), log_probs=True)
    loss = label_smoothed_nll(lprobs.flatten(0, 1), sample["target"].flatten(), 0.0, 1)[0]
    loss.backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_same(eager, compiled, tol):
    assert (eager[0] - compiled[0]).abs().max().item() < tol
    assert eager[1].keys() == compiled[1].keys() and len(eager[1]) > 10
    for name, grad in eager[1].items():
        err = (grad - compiled[1][name]).abs().max().item()
        assert err < tol * max(1.0, grad.abs().max().item()), (name, err)


def _check_against_eager(transformer, dtype, tol):
    _, model, ds = transformer
    model = model.to(dtype).eval()
    try:
        for n in (6, 9):
            sample, fed = _batch(ds, n)
            _assert_same(_pass(model, sample, fed, False), _pass(model, sample, fed, True), tol)
    finally:
        model.float()
    assert not compiled_step._failed
    assert {backend for backend, _ in compiled_step._compiled} == {compiled_step.BACKEND}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_the_compiled_step_gives_the_eager_scores_and_gradients(models, arch, backend):
    backend("aot_eager")
    _check_against_eager(models[arch], torch.float64, 1e-10)


def test_a_compiler_that_fails_leaves_one_log_line_and_the_eager_results(transformer, backend, caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler found")
    backend(broken)
    _, model, ds = transformer
    model.double().eval()
    try:
        sample, fed = _batch(ds, 6)
        eager = _pass(model, sample, fed, False)
        with caplog.at_level(logging.INFO, logger="fairseq_ext.decoding.compiled_step"):
            first = _pass(model, sample, fed, True)
            second = _pass(model, sample, fed, True)
    finally:
        model.float()
    _assert_same(eager, first, 1e-10)
    _assert_same(eager, second, 1e-10)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "compiling the decoder step failed" in lines[0] and "no C++ compiler" in lines[0]


def _counting(backend) -> list:
    """Compiles with a backend that runs the traced graphs as they are (the compiler's tracing
    only) and counts them: the list of graphs."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    backend(counting)
    return graphs


def test_dss_compile_on_trains_on_the_compiled_step(transformer, backend, monkeypatch):
    """--dss-compile on: the criterion's loss and gradients through the compiled step, equal
    to --dss-compile off's; off never compiles. The traces are a few (the first positions,
    whose caches are empty or of size one, and the rest), whatever the number of positions."""
    graphs = _counting(backend)
    task, model, ds = transformer
    sample = ds.collater([ds[i] for i in range(6)])
    model.train()  # the criterion decodes in training only; without dropout, to compare the two
    for module in model.modules():
        if hasattr(module, "p") and isinstance(module.p, float):
            monkeypatch.setattr(module, "p", 0.0)
    results = {}
    for mode in ("off", "on"):
        crit = DSSCriterion(task, dss_schedule="always", dss_warmup=0.0, dss_compile=mode)
        assert crit.schedule_values()[0] == 0.0  # every position fed the soft decision
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        loss = crit(model, sample)[0]
        loss.backward()
        results[mode] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        assert bool(compiled_step._compiled) == (mode == "on") and bool(graphs) == (mode == "on")
    model.eval()
    assert not compiled_step._failed
    assert sample["target"].size(1) > 6 and len(graphs) <= 4, len(graphs)
    _assert_same(results["off"], results["on"], 1e-5)


def _search(task, model, sample, compiled):
    """Loss (summed over the batch) and every parameter's gradient of the soft beam's direct loss."""
    model.zero_grad(set_to_none=True)
    criterion = SoftBeamDirectLossCriterion(task, soft_beam_size=3, soft_beam_alpha=2.0,
                                            soft_beam_compile="on" if compiled else "off")
    loss = criterion(model, sample)[0]
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_soft_beam_compile_on_searches_with_the_compiled_steps(models, backend):
    """--soft-beam-compile on: the direct loss and its gradients through the compiled decoder
    step and soft beam step equal --soft-beam-compile off's, with sentences leaving the search
    at different steps (the rows shrink); a few traces of each."""
    graphs = _counting(backend)
    task, model, ds = models["transformer"]
    model.eval()
    sample = ds.collater([ds[i] for i in range(8)])
    assert sample["target"].ne(1).sum(1).unique().numel() > 2  # several leaving steps
    eager = _search(task, model, sample, False)
    assert not graphs
    _assert_same(eager, _search(task, model, sample, True), 1e-5)
    assert not compiled_step._failed and len(compiled_step._compiled) == 2
    assert 2 <= len(graphs) <= 6, len(graphs)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_the_compiled_soft_beam_gives_the_eager_loss_and_gradients(models, arch, backend):
    """The compiler's tracing, functionalisation and autograd (aot_eager) in float64."""
    backend("aot_eager")
    task, model, ds = models[arch]
    model.double().eval()
    try:
        sample = ds.collater([ds[i] for i in range(8)])
        _assert_same(_search(task, model, sample, False), _search(task, model, sample, True), 1e-10)
    finally:
        model.float()
    assert not compiled_step._failed


@pytest.mark.slow
def test_the_inductor_compiled_step_gives_the_eager_scores_and_gradients(transformer, backend):
    """Inductor's generated kernels (minutes of compiling on a small CPU)."""
    backend("inductor")
    _check_against_eager(transformer, torch.float32, 1e-5)


def test_dss_compile_needs_the_exact_pass(transformer):
    task = transformer[0]
    with pytest.raises(ConfigError, match=r"--dss-compile on .*needs --dss-passes 0, got --dss-passes 2"):
        DSSCriterion(task, dss_passes=2, dss_compile="on")
    DSSCriterion(task, dss_passes=2, dss_compile="off")
