"""Which errors of fairseq's checkpoint loading the plugin relabels as one line
(runtime/checkpoints.py, ``load_checkpoint_to_cpu``): a file that is missing, unreadable or
holds no fairseq checkpoint gets ``FILE: ...`` (a ConfigError, exit 2 at the command
line); any other error while loading a real checkpoint, a bug in an upgrade step for
one, keeps its own type and traceback."""
import os

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_ext  # noqa: F401  (installs the patches)
from fairseq_ext.runtime.cli import ConfigError

MINIMAL = {"model": {}, "args": None, "cfg": None, "extra_state": {},
           "optimizer_history": [{"criterion_name": "x", "optimizer_name": "y", "lr_scheduler_state": {},
                                  "num_updates": 0}]}


def _saved(tmp_path, name, obj) -> str:
    path = str(tmp_path / name)
    torch.save(obj, path)
    return path


def test_a_minimal_checkpoint_loads(tmp_path):
    state = checkpoint_utils.load_checkpoint_to_cpu(_saved(tmp_path, "ok.pt", MINIMAL))
    assert state["model"] == {}


@pytest.mark.parametrize("name,obj,message", [
    ("tensor.pt", torch.zeros(2), "not a fairseq checkpoint: it holds a Tensor"),
    ("dict.pt", {"weights": 1, "step": 2}, "not a fairseq checkpoint: it holds a dict with 'weights', 'step'"),
])
def test_a_file_that_holds_no_checkpoint_is_one_line(tmp_path, name, obj, message):
    path = _saved(tmp_path, name, obj)
    with pytest.raises(ConfigError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(path)
    assert str(err.value).startswith(f"{path}: cannot load it as a checkpoint ({message}")


def test_unreadable_and_missing_files_are_one_line(tmp_path):
    text = tmp_path / "text.pt"
    text.write_text("not a checkpoint\n")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(open(_saved(tmp_path, "full.pt", MINIMAL), "rb").read()[:100])
    for path, start in ((text, "UnpicklingError"), (truncated, "RuntimeError")):
        with pytest.raises(ConfigError, match=f"^{path}: cannot load it as a checkpoint \\({start}"):
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
    with pytest.raises(ConfigError, match="no such checkpoint file"):
        checkpoint_utils.load_checkpoint_to_cpu(os.path.join(tmp_path, "nosuch.pt"))


@pytest.mark.parametrize("error", [KeyError("best_loss"), RuntimeError("an upgrade step failed"), TypeError("bug")])
def test_any_other_error_while_loading_a_checkpoint_keeps_its_traceback(tmp_path, monkeypatch, error):
    """An upgrade step that fails on a real checkpoint (fairseq's own here, standing for any
    code that runs while loading) propagates as it is, not as "cannot load it"."""
    path = _saved(tmp_path, "ok.pt", MINIMAL)

    def broken(state):
        raise error
    monkeypatch.setattr(checkpoint_utils, "_upgrade_state_dict", broken)
    with pytest.raises(type(error)) as err:
        checkpoint_utils.load_checkpoint_to_cpu(path)
    assert err.value is error and not isinstance(err.value, ConfigError)
