"""--decoding-path, the one option that chooses how every decoding criterion decodes
(fairseq_ext/decoding/steps.py): for MGS, MRT, PG, DSS and both soft beam criteria,
parsed by fairseq from the command line, ``fairseq`` builds no static-cache step and
``static-cache`` builds one, both through the same search loop (the loop asks
``steps.build_step`` for its step and gets ``FairseqStep`` or the static-cache step), and the
two give the same loss and gradients from the same random state (the paths draw the same
random numbers for the same rows)."""
import os
import subprocess

import pytest
import torch
from fairseq import options

from conftest import REPO
from fairseq_ext.decoding import beam_search, candidates, dss_passes, lstm_step, steps, transformer_step
from fairseq_ext.decoding.fairseq_step import FairseqStep
from fairseq_ext.synthetic import tiny_models

CRITERIA = {
    "mgs": ["--criterion", "mgs", "--mgs-candidates", "2", "--mgs-task-loss", "edit", "--mgs-decoder", "sample"],
    "mrt": ["--criterion", "mrt", "--mrt-candidates", "3", "--mrt-task-loss", "edit"],
    "pg": ["--criterion", "pg", "--pg-samples", "3", "--pg-task-loss", "edit", "--pg-baseline", "greedy"],
    "dss": ["--criterion", "differentiable_scheduled_sampling", "--dss-schedule", "always", "--dss-warmup", "0"],
    "soft_beam_direct_loss": ["--criterion", "soft_beam_direct_loss", "--soft-beam-size", "2"],
    "soft_beam_hinge": ["--criterion", "soft_beam_hinge", "--soft-beam-size", "2"],
}


@pytest.fixture(scope="module")
def translator(toy_bin):
    task, model, _ = tiny_models.build_task_and_model(toy_bin, "translation", "transformer", ["--dropout", "0"])
    task.load_dataset("valid")
    ds = task.dataset("valid")
    return toy_bin, task, model.train(), ds.collater([ds[i] for i in range(6)])


def _criterion(data, task, name, path):
    argv = [data, "--task", "translation", "--user-dir", os.path.join(REPO, "fairseq_ext"), "--dropout", "0"]
    if path is not None:
        argv += ["--decoding-path", path]
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       argv + tiny_models.TINY_ARCHS["transformer"] + CRITERIA[name])
    return task.build_criterion(args)


LOOPS = (candidates, beam_search, dss_passes)  # the modules whose search loops ask build_step for a step


def _run(model, sample, criterion, monkeypatch):
    """(loss, gradients, static-cache steps built, {(the loop that asked, the step class it got)})
    of one update from seed 3."""
    built, asked = [], set()
    for cls in (transformer_step.TransformerStep, lstm_step.LSTMStep):
        init = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _init=init, **k: (built.append(1), _init(self, *a, **k))[1])
    for module in LOOPS:
        def recorded(*args, _module=module, **kwargs):
            step = steps.build_step(*args, **kwargs)
            asked.add((_module.__name__.rsplit(".", 1)[-1], type(step).__name__))
            return step
        monkeypatch.setattr(module, "build_step", recorded)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    loss, _, _ = criterion(model, sample)
    loss.backward()
    monkeypatch.undo()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], len(built), asked


@pytest.mark.parametrize("name", list(CRITERIA))
def test_one_option_selects_fairseqs_path_for_every_criterion(translator, name, monkeypatch):
    data, task, model, sample = translator
    default = _criterion(data, task, name, None)
    static_loss, static_grads, static_steps, static_loops = _run(model, sample, default, monkeypatch)
    ref_loss, ref_grads, ref_steps, ref_loops = _run(model, sample, _criterion(data, task, name, "fairseq"),
                                                     monkeypatch)
    assert static_steps > 0, "the default decodes with the static-cache step"
    assert ref_steps == 0, "--decoding-path fairseq builds no static-cache step"
    loops = {loop for loop, _ in static_loops}
    assert len(loops) == 1 and static_loops == {(loop, "TransformerStep") for loop in loops}
    assert ref_loops == {(loop, FairseqStep.__name__) for loop in loops}, "both paths run the same loop"
    assert torch.isfinite(static_loss) and abs(static_loss.item()) > 0
    assert (static_loss - ref_loss).abs().item() <= 1e-4 * max(1.0, ref_loss.abs().item())
    assert len(static_grads) == len(ref_grads)
    for a, b in zip(static_grads, ref_grads):
        assert (a - b).abs().max().item() <= 1e-3 * max(1.0, b.abs().max().item())


def test_an_unknown_decoding_path_is_one_line(toy_bin, tmp_path):
    from conftest import cli_env

    proc = subprocess.run(["fairseq-train", toy_bin, "--user-dir", os.path.join(REPO, "fairseq_ext"),
                           "--task", "translation", "--arch", "transformer", "--criterion", "mrt",
                           "--save-dir", str(tmp_path / "ck"), "--decoding-path", "cuda"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["fairseq-train: error: argument --decoding-path: invalid choice: 'cuda' (choose from "
                     "'static-cache', 'fairseq')"], proc.stderr[-2000:]
    assert not (tmp_path / "ck").exists()
