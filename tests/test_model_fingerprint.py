"""scripts/model_fingerprint.py and examples/lib.sh's same_model: results of two models never mix."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "model_fingerprint.py")
_spec = importlib.util.spec_from_file_location("model_fingerprint", SCRIPT)
model_fingerprint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model_fingerprint)


def _model(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"encoder.w": torch.randn(4, 3, generator=g), "decoder.w": torch.randn(4, 3, generator=g),
            "decoder.b": torch.zeros(3), "decoder.steps": torch.tensor(7)}


def _save(path, model, **extra):
    torch.save({"model": model, **extra}, path)
    return str(path)


def _fp(path):
    out = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_fingerprint_follows_the_parameters_not_the_rest_of_the_checkpoint(tmp_path):
    m = _model()
    full = _save(tmp_path / "full.pt", m, last_optimizer_state={"exp_avg": torch.ones(5)},
                 extra_state={"num_updates": 12000})
    model_only = _save(tmp_path / "model_only.pt", {k: v.clone() for k, v in reversed(list(m.items()))})
    assert _fp(full) == _fp(model_only)  # other optimizer state, other key order: the same model
    sha = model_fingerprint.fingerprint(m)[0]
    assert sha == _fp(full)

    one_ulp = {k: v.clone() for k, v in m.items()}
    one_ulp["decoder.b"][1] = torch.nextafter(torch.tensor(0.0), torch.tensor(1.0))
    swapped = dict(m, **{"encoder.w": m["decoder.w"], "decoder.w": m["encoder.w"]})
    renamed = {("encoder.v" if k == "encoder.w" else k): v for k, v in m.items()}
    as_double = {k: v.double() if v.is_floating_point() else v for k, v in m.items()}
    others = [model_fingerprint.fingerprint(d)[0] for d in (one_ulp, swapped, renamed, as_double, _model(seed=1))]
    assert len(set(others + [sha])) == 6


def test_fingerprint_json_and_bad_input(tmp_path):
    ckpt = _save(tmp_path / "m.pt", _model())
    out = subprocess.run([sys.executable, SCRIPT, ckpt, "--json", str(tmp_path / "fp.json")],
                         capture_output=True, text=True, check=True)
    rec = json.load(open(tmp_path / "fp.json"))
    assert rec["sha256"] == out.stdout.strip() and rec["tensors"] == 4 and rec["params"] == 4 * 3 * 2 + 3 + 1
    torch.save({"state": 1}, tmp_path / "not_fairseq.pt")
    for bad in (tmp_path / "not_fairseq.pt", tmp_path / "missing.pt"):
        out = subprocess.run([sys.executable, SCRIPT, str(bad)], capture_output=True, text=True)
        assert out.returncode != 0 and str(bad) in out.stderr and len(out.stderr.strip().splitlines()) == 1


def _same_model(d, ckpt):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", "-c", '. examples/lib.sh; same_model "$0" "$1"', str(d), ckpt],
                          cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.skipif(sys.platform == "win32", reason="bash recipe helper")
def test_same_model_refuses_rows_of_another_model(tmp_path):
    a = _save(tmp_path / "a.pt", _model(0))
    a_copy = _save(tmp_path / "a_copy.pt", _model(0), extra_state={"other": 1})
    b = _save(tmp_path / "b.pt", _model(1))
    rows = tmp_path / "rows"
    rows.mkdir()
    assert _same_model(rows, a).returncode == 0  # first use: records the model
    assert json.load(open(rows / "model_fingerprint.json"))["sha256"] == _fp(a)
    (rows / "run1.json").write_text("{}")
    assert _same_model(rows, a_copy).returncode == 0  # the same parameters, another file
    out = _same_model(rows, b)
    assert out.returncode == 1 and str(rows) in out.stderr and "another model" in out.stderr
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "run1.json").write_text("{}")  # rows kept without their model's fingerprint
    out = _same_model(unknown, a)
    assert out.returncode == 1 and "no model_fingerprint.json" in out.stderr
    assert not (unknown / "model_fingerprint.json").exists()
