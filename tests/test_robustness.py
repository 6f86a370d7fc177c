"""Crash safety and start-up checks (docs/distributed.md): a run killed mid-epoch
leaves a loadable checkpoint that resumes; a model a criterion cannot train, a
missing scorer checkpoint or a malformed data directory stops the run with a clear
message before the first training step."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import REPO, cli_env, run_cli
from fairseq_ext.synthetic import tiny_models, toy

LM = ["--task", "language_modeling", "--tokens-per-sample", "32", "--max-tokens", "256"] + tiny_models.TINY_ARCHS["transformer_lm"]
TRAIN = ["--user-dir", "fairseq_ext", "--optimizer", "adam", "--lr", "0.003", "--seed", "1", "--num-workers", "0",
         "--log-format", "simple", "--log-interval", "1"]


def _env():
    return cli_env(OMP_NUM_THREADS="1")


def test_killed_run_leaves_a_loadable_checkpoint_that_resumes(toy_bin, tmp_path):
    save = tmp_path / "ck"
    base = ["fairseq-train", toy_bin, *TRAIN, "--task", "translation", *tiny_models.TINY_ARCHS["transformer"],
            "--criterion", "differentiable_scheduled_sampling", "--dss-schedule-unit", "update", "--dss-warmup", "2",
            "--max-tokens", "200", "--no-epoch-checkpoints", "--disable-validation", "--save-dir", str(save)]
    cmd = base + ["--max-update", "100000", "--save-interval-updates", "3"]
    log = open(tmp_path / "log", "w")
    # a real process (not the test fork server's child): SIGKILL must hit the training process itself
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(_env(), FAIRSEQ_EXT_FORKSERVER=""), stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (save / "checkpoint_last.pt").exists():
            assert proc.poll() is None, (tmp_path / "log").read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # let it train (and maybe save again) before the kill
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()
    assert (save / "checkpoint_last.pt").exists(), "no checkpoint within 300 s"
    out = run_cli(base + ["--max-update", "1", "--no-save"]).stdout
    # fairseq prints "loaded checkpoint ... (epoch E @ U updates)" (and stops at once: U > max-update 1)
    updates = int(re.search(r"[Ll]oaded checkpoint .*\(epoch \d+ @ (\d+) updates\)", out).group(1))
    assert updates > 0 and updates % 3 == 0
    resumed = run_cli(base + ["--max-update", str(updates + 2), "--no-save"]).stdout
    assert f"num_updates {updates + 2}" in resumed or f"num_updates={updates + 2}" in resumed, resumed[-2000:]


@pytest.mark.parametrize("criterion,message", [
    (["--criterion", "soft_beam_direct_loss"], "--criterion soft_beam_direct_loss needs an encoder-decoder model"),
    (["--criterion", "soft_beam_hinge"], "--criterion soft_beam_hinge needs an encoder-decoder model"),
    (["--criterion", "differentiable_scheduled_sampling"],
     "--criterion differentiable_scheduled_sampling needs an encoder-decoder model"),
    (["--criterion", "mgs", "--mgs-task-loss", "edit"], "--criterion mgs: TransformerLanguageModel has no encoder"),
    (["--criterion", "mrt", "--mrt-task-loss", "edit"], "--criterion mrt: TransformerLanguageModel has no encoder"),
    (["--criterion", "pg", "--pg-task-loss", "edit"], "--criterion pg: TransformerLanguageModel has no encoder"),
    (["--criterion", "mgs", "--mgs-task-loss", "lm", "--mgs-score-model", "/no/such/scorer.pt"],
     "--mgs-score-model: no such file /no/such/scorer.pt"),
])
def test_unusable_setups_stop_before_training(criterion, message, toy_lm_bin, tmp_path):
    proc = subprocess.run(["fairseq-train", toy_lm_bin, *TRAIN, *LM, *criterion, "--max-update", "2",
                           "--save-dir", str(tmp_path / "ck")], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "num_updates" not in proc.stdout + proc.stderr, "training started"
    assert not (tmp_path / "ck" / "crash.pt").exists()


def test_malformed_data_directories_are_named(tmp_path, toy_bin):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(["fairseq-train", str(empty), "--user-dir", "fairseq_ext", "--task", "sequence_tagging",
                           "--arch", "tagging_lstm_tiny", "--criterion", "soft_beam_direct_loss", "--batch-size", "4",
                           "--tagging-cache-dir", str(tmp_path / "cache"), "--save-dir", str(tmp_path / "ck")],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"no train.txt in data directory '{empty}'" in proc.stderr, proc.stderr[-2000:]
    (empty / "train.txt").write_text("EU B-ORG\nrejects\n")
    proc = subprocess.run(proc.args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"{empty}/train.txt:2: expected at least 2 columns" in proc.stderr, \
        proc.stderr[-2000:]


def test_checkpoint_copies_replace_the_old_file_atomically(tmp_path, monkeypatch):
    """fairseq copies each saved checkpoint to checkpoint_last.pt; a copy that dies
    half-way (here: an exception after the first chunk) must leave the old file whole."""
    import shutil

    from fairseq import checkpoint_utils

    from fairseq_ext.runtime import checkpoints

    checkpoints.atomic_copies()  # applied where the plugin's components run

    src, dst = tmp_path / "checkpoint_1_3.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 100000)
    dst.write_bytes(b"old checkpoint")

    def dying_copy(fsrc, fdst, length=0):
        fdst.write(fsrc.read(1000))
        raise KeyboardInterrupt("killed during the copy")

    monkeypatch.setattr(shutil, "copyfileobj", dying_copy)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old checkpoint"
    monkeypatch.undo()
    assert checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()


def test_a_run_stopped_mid_epoch_exits_cleanly(tmp_path):
    """fairseq makes batches in a daemon thread that is still running when
    --max-update stops a run in the middle of an epoch; without the plugin's exit hook
    (fixes.stop_batch_threads_at_exit, applied where the plugin's components run) this small language model aborted at exit
    with "terminate called without an active exception" (exit 134) after "done
    training", in every try (6 of 6 with 100 updates, 4 of 4 with 30). Two runs must both
    exit 0, as real processes (a fork server's child leaves without destroying torch's
    static objects, so it cannot show the abort)."""
    from fairseq_ext.synthetic import residual

    raw = residual.write(str(tmp_path / "raw"), vocab=8, prefix_len=8, continuation_len=5,
                             sizes={"train": 2000, "valid": 50, "test": 50})
    data = toy.binarize_lines(raw, str(tmp_path / "bin"))
    for i in range(2):
        proc = run_cli(["fairseq-train", data, "--user-dir", "fairseq_ext", "--task", "language_modeling",
                        "--criterion", "self_normalized_ce", "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
                        "--decoder-output-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
                        "--tokens-per-sample", "13", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000",
                        "--max-update", "30", "--save-dir", str(tmp_path / f"lm{i}"), "--no-epoch-checkpoints",
                        "--disable-validation", "--num-workers", "0", "--seed", "1"],
                       env={"FAIRSEQ_EXT_FORKSERVER": ""})
        assert "done training" in proc.stdout + proc.stderr


def test_commands_sharing_a_save_dir_start_without_racing(tmp_path, monkeypatch):
    """fairseq-train checks --save-dir by creating and deleting SAVE_DIR/dummy; the suite's
    commands starting together in one directory (every --no-save run without --save-dir
    uses ./checkpoints) delete each other's file and die with FileNotFoundError (fairseq's
    own check fails this within a few hundred calls from 8 threads). The fork server that
    runs them checks with a uniquely named file instead (forkserver._unique_save_dir_check)."""
    import threading

    import forkserver
    from fairseq import checkpoint_utils

    monkeypatch.setattr(checkpoint_utils, "verify_checkpoint_directory", checkpoint_utils.verify_checkpoint_directory)
    forkserver._unique_save_dir_check()

    save_dir, errors = str(tmp_path / "checkpoints"), []

    def start_runs():
        try:
            for _ in range(300):
                checkpoint_utils.verify_checkpoint_directory(save_dir)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=start_runs) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert os.listdir(save_dir) == []  # the check leaves nothing behind
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OSError):  # an unusable directory still fails
        checkpoint_utils.verify_checkpoint_directory(str(tmp_path / "a_file" / "checkpoints"))
