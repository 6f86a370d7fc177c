"""--amp's loss scaling (fairseq_ext.runtime.fixes.amp_loss_scaler, applied where the plugin's components run), checked on the CPU with a
CPU GradScaler in place of CUDA's: the update is the optimizer's step on the gradient (hand-
computed SGD step), and the scaler starts at --amp-init-scale and grows after
--amp-scale-window updates. fairseq 0.12's own AMPOptimizer is the control: it divides the
gradient by the loss scale a second time and mixes the options up (the latter reported upstream:
https://github.com/facebookresearch/fairseq/issues/5342); tests/test_gpu.py shows both on CUDA
(docs/performance.md)."""
from types import SimpleNamespace

import pytest
import torch

import fairseq_ext  # noqa: F401
from fairseq_ext.runtime import fixes

amp_optimizer = pytest.importorskip("fairseq.optim.amp_optimizer")
fixes.amp_loss_scaler()  # what a command choosing a plugin component gets
from fairseq.optim.sgd import SGD  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

AMP = amp_optimizer.AMPOptimizer
FAIRSEQ_INIT, FAIRSEQ_CLIP = AMP.__init__.__wrapped__, AMP.clip_grad_norm.__wrapped__  # fairseq's own


def _cfg(fp16_init_scale, amp_init_scale, amp_scale_window):
    common = SimpleNamespace(fp16_init_scale=fp16_init_scale, amp_init_scale=amp_init_scale,
                             amp_scale_window=amp_scale_window, min_loss_scale=1e-4)
    return SimpleNamespace(common=common, optimizer=SimpleNamespace())


def _scaler_options(init, monkeypatch, *scales):
    """The keyword arguments of the GradScaler that ``init`` leaves the optimizer with."""
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", lambda **kw: SimpleNamespace(options=kw))
    opt = object.__new__(AMP)
    init(opt, _cfg(*scales), [], fp32_optimizer=None)
    return opt.scaler.options


def test_amp_scaler_takes_the_amp_options(monkeypatch):
    assert _scaler_options(AMP.__init__, monkeypatch, 128, 4, 1000) == {"init_scale": 4, "growth_interval": 1000}
    # the control: fairseq's constructor starts at --fp16-init-scale, grows every --amp-init-scale updates
    assert _scaler_options(FAIRSEQ_INIT, monkeypatch, 128, 4, 1000) == {"init_scale": 128, "growth_interval": 4}


def test_amp_scaler_defaults_are_unchanged(monkeypatch):
    """Neither --amp option given: the scaler fairseq builds (scale 128, torch's window)."""
    ours = _scaler_options(AMP.__init__, monkeypatch, 128, 128, None)
    assert ours == _scaler_options(FAIRSEQ_INIT, monkeypatch, 128, 128, None) == {"init_scale": 128}


def _amp_sgd_step(clip, monkeypatch, scale=128.0):
    """One fairseq AMP update (backward of the scaled loss, clip_grad_norm as fairseq's trainer
    calls it at every update, step) of SGD with lr 0.1 on the loss 3 p0 + 5 p1 from p = (1, 2)."""
    try:
        torch.amp.GradScaler("cpu")
    except (AttributeError, TypeError, RuntimeError):
        pytest.skip("this torch has no CPU GradScaler")
    monkeypatch.setattr(torch.cuda.amp, "GradScaler", lambda **kw: torch.amp.GradScaler("cpu", **kw))
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    sgd = SGD(OmegaConf.create({"lr": [0.1], "momentum": 0.0, "weight_decay": 0.0}), [p])
    opt = AMP(OmegaConf.create({"common": {"fp16_init_scale": scale, "amp_init_scale": scale,
                                           "amp_scale_window": None, "min_loss_scale": 1e-4},
                                "optimizer": {"lr": [0.1]}}), [p], sgd)
    opt.backward((p * torch.tensor([3.0, 5.0])).sum())
    norm = clip(opt, 0.0)
    opt.step()
    return p.detach(), float(norm)


def test_amp_update_unscales_the_gradient_once(monkeypatch):
    p, norm = _amp_sgd_step(AMP.clip_grad_norm, monkeypatch)
    assert norm == pytest.approx(34 ** 0.5)  # |(3, 5)|
    assert torch.allclose(p, torch.tensor([1 - 0.1 * 3, 2 - 0.1 * 5]), rtol=0, atol=1e-7)
    # the control: fairseq's clip_grad_norm unscales another object than step() hands on,
    # so the step is lr x gradient / 128
    p, norm = _amp_sgd_step(FAIRSEQ_CLIP, monkeypatch)
    assert norm == pytest.approx(34 ** 0.5)
    assert torch.allclose(p, torch.tensor([1 - 0.1 * 3 / 128, 2 - 0.1 * 5 / 128]), rtol=0, atol=1e-7)


def test_amp_fix_can_be_turned_off(monkeypatch):
    """FAIRSEQ_EXT_AMP_FIX=0 leaves fairseq's AMPOptimizer as it is (to repeat an old run)."""
    for value, patched in (("0", False), ("1", True)):
        fresh = type("AMPOptimizer", (), {"__init__": FAIRSEQ_INIT, "clip_grad_norm": FAIRSEQ_CLIP})
        monkeypatch.setattr(amp_optimizer, "AMPOptimizer", fresh)
        monkeypatch.setenv("FAIRSEQ_EXT_AMP_FIX", value)
        fixes.amp_loss_scaler()
        assert (fresh.clip_grad_norm is not FAIRSEQ_CLIP) == patched, value
        assert (fresh.__init__ is not FAIRSEQ_INIT) == patched, value
