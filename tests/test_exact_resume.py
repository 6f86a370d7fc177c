"""fairseq_ext.runtime.fixes.exact_resume (on where a plugin component runs: here the task
``translation_search``, whose training is fairseq's translation): a run stopped after epoch 2 and
resumed is the same model as the run trained straight through; with
FAIRSEQ_EXT_EXACT_RESUME=0, fairseq's own resume cuts other batches and the models differ
(the control: the test fails if the patch does nothing, and says so if fairseq itself
becomes exact)."""
import os

import torch

from conftest import run_cli

USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fairseq_ext")
ARGS = ["--user-dir", USER_DIR, "--task", "translation_search", "--arch", "transformer", "--encoder-layers", "1",
        "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0.1", "--criterion", "cross_entropy", "--optimizer", "adam",
        "--lr", "0.003", "--max-tokens", "500", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints",
        "--disable-validation"]


def _train(toy_bin, save, env, *epochs):
    for e in epochs:  # one fairseq-train call per entry: the later ones resume from checkpoint_last.pt
        run_cli(["fairseq-train", toy_bin, *ARGS, "--max-epoch", str(e), "--save-dir", str(save)], env=env)
    return torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=False)["model"]


def _max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_a_resumed_run_is_the_uninterrupted_model_only_with_exact_resume(toy_bin, tmp_path):
    exact = {}  # the default
    straight = _train(toy_bin, tmp_path / "straight", exact, 3)
    resumed = _train(toy_bin, tmp_path / "resumed", exact, 2, 3)
    assert _max_diff(straight, resumed) == 0.0
    # stopped in the middle of epoch 2 (a --save-interval-updates checkpoint), resumed there
    mid = tmp_path / "mid"
    run_cli(["fairseq-train", toy_bin, *ARGS, "--max-update", "8", "--save-interval-updates", "8",
             "--save-dir", str(mid)], env=exact)
    assert _max_diff(straight, _train(toy_bin, mid, exact, 3)) == 0.0
    # fairseq's own resume (FAIRSEQ_EXT_EXACT_RESUME=0) drifts: the control that makes the check above meaningful
    plain = {"FAIRSEQ_EXT_EXACT_RESUME": "0"}
    plain_straight = _train(toy_bin, tmp_path / "plain_straight", plain, 3)
    plain_resumed = _train(toy_bin, tmp_path / "plain_resumed", plain, 2, 3)
    assert _max_diff(plain_straight, straight) == 0.0  # straight runs do not change with the patch
    assert _max_diff(plain_straight, plain_resumed) > 1e-4, "fairseq resumes exactly now: the patch is not needed"
