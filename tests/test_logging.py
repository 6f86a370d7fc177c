"""Training logs: ``fairseq-train --tensorboard-logdir`` writes event files holding
the criterion's own metrics (tensorboardX is in the test extra), and
scripts/plot/plot_log.py draws logged metrics of several runs (fairseq JSON logs) as one
PNG (docs/logging.md)."""
import glob
import json
import os
import struct
import subprocess

import pytest

from conftest import REPO, cli_env, run_cli
from fairseq_ext.evaluation.train_log import plot

TINY = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
    "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings", "--seed", "1",
    "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "1000", "--num-workers", "0", "--no-save",
    "--log-format", "json",
]


@pytest.fixture(scope="module")
def runs(toy_bin, tmp_path_factory):
    """Two short runs with JSON logs: MGS (4 updates, logged every update, with
    --tensorboard-logdir and --log-file mgs.log; its console log in mgs.stdout) and
    cross-entropy (8 updates, logged every 2; its console log in ce.log)."""
    out = tmp_path_factory.mktemp("logs")
    proc = run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", "mgs",
                    "--mgs-task-loss", "edit", "--mgs-candidates", "2", "--max-update", "4", "--log-interval", "1",
                    "--tensorboard-logdir", str(out / "tb"), "--log-file", str(out / "mgs.log"),
                    "--save-dir", str(out)], env={"OMP_NUM_THREADS": "1"})
    (out / "mgs.stdout").write_text(proc.stdout)
    proc = run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", "cross_entropy",
                    "--max-update", "8", "--log-interval", "2", "--save-dir", str(out)], env={"OMP_NUM_THREADS": "1"})
    (out / "ce.log").write_text(proc.stdout)
    return out


def stats_lines(log, tag):
    """The JSON dicts of the ``| TAG | {...}`` lines of fairseq's console log."""
    marker = f"| {tag} | "
    return [json.loads(line.split(marker, 1)[1]) for line in open(log) if marker in line]


def read_scalars(logdir):
    """{(subdirectory, tag): {step: value}} of the scalars in TensorBoard event files
    (TFRecords: u64 length, u32 crc, an Event protobuf, u32 crc)."""
    from tensorboardX.proto.event_pb2 import Event

    out = {}
    for path in glob.glob(os.path.join(logdir, "*", "events.out.tfevents.*")):
        data, pos = open(path, "rb").read(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault((os.path.basename(os.path.dirname(path)), value.tag), {})[event.step] = value.simple_value
    return out


def test_tensorboard_event_files_hold_the_criterions_metrics(runs):
    scalars = read_scalars(runs / "tb")
    logged = stats_lines(runs / "mgs.stdout", "train_inner")
    assert [int(r["num_updates"]) for r in logged] == [1, 2, 3, 4]
    for key in ("loss", "mgs_weight_entropy", "mgs_mle_weight", "mgs_cand_mean"):
        assert scalars[("train_inner", key)] == {int(r["num_updates"]): pytest.approx(float(r[key]), abs=1e-3)
                                                 for r in logged}, key
    valid = stats_lines(runs / "mgs.stdout", "valid")
    assert scalars[("valid", "task_loss")] == {int(r["valid_num_updates"]): pytest.approx(float(r["valid_task_loss"]),
                                                                                        abs=1e-3) for r in valid}


def points(records, x, y):
    return [[float(r[x]) for r in records], [float(r[y]) for r in records]]


def test_plot_log_draws_the_logged_values_of_several_runs(runs, tmp_path):
    """One run read from --log-file (bare JSON lines), one from the console log."""
    png, points_json = tmp_path / "fig.png", tmp_path / "fig.json"
    run_cli(["python", "scripts/plot/plot_log.py", str(runs / "mgs.log"), str(runs / "ce.log"), "--labels", "mgs,ce",
             "--metric", "loss", "mgs_weight_entropy", "valid_loss", "--out", str(png), "--json", str(points_json)])
    mgs, ce = (stats_lines(runs / name, "train_inner") for name in ("mgs.stdout", "ce.log"))
    valid = {name: stats_lines(runs / log, "valid") for name, log in (("mgs", "mgs.stdout"), ("ce", "ce.log"))}
    expected = {
        "loss": {"mgs": points(mgs, "num_updates", "loss"), "ce": points(ce, "num_updates", "loss")},
        "mgs_weight_entropy": {"mgs": points(mgs, "num_updates", "mgs_weight_entropy")},  # not logged by ce
        "valid_loss": {k: points(v, "valid_num_updates", "valid_loss") for k, v in valid.items()},
    }
    assert json.loads(points_json.read_text()) == expected
    assert len(expected["loss"]["ce"][0]) == 4 and expected["loss"]["ce"][0][-1] == 8.0
    from matplotlib.image import imread

    image = imread(str(png))
    assert image.shape[:2] == (858, 660) and image.std() > 0  # three 6 x 2.6 inch panels at 110 dpi

    fig = plot(expected, "num_updates")
    for ax, (metric, by_run) in zip(fig.axes, expected.items()):
        assert ax.get_ylabel() == metric
        drawn = {line.get_label(): [list(line.get_xdata()), list(line.get_ydata())] for line in ax.get_lines()}
        assert drawn == by_run


def test_plot_log_mgs_draws_the_diagnostics_of_an_mgs_run(runs, tmp_path):
    """--mgs: three panels (weights; MLE component; pooled and candidate costs), one line per
    metric, each with the values the MGS run logged at every update."""
    png, points_json = tmp_path / "mgs.png", tmp_path / "mgs.json"
    run_cli(["python", "scripts/plot/plot_log.py", str(runs / "mgs.log"), "--mgs", "--out", str(png),
             "--json", str(points_json)])
    logged = stats_lines(runs / "mgs.stdout", "train_inner")
    panels = {"mgs_weight_entropy+mgs_weight_std": ["mgs_weight_entropy", "mgs_weight_std"],
              "mgs_mle_weight+mgs_top_is_mle": ["mgs_mle_weight", "mgs_top_is_mle"],
              "loss+mgs_cand_best+mgs_cand_mean": ["loss", "mgs_cand_best", "mgs_cand_mean"]}
    expected = {panel: {m: points(logged, "num_updates", m) for m in names} for panel, names in panels.items()}
    assert json.loads(points_json.read_text()) == expected
    assert expected["loss+mgs_cand_best+mgs_cand_mean"]["loss"][0] == [1.0, 2.0, 3.0, 4.0]
    from matplotlib.image import imread

    assert imread(str(png)).shape[:2] == (858, 660)  # three panels


@pytest.mark.parametrize("args,message", [
    (["--metric", "nosuch"], "plot_log.py: error: --metric nosuch (with --x num_updates) is in none of the logs; logged: "),
    (["--metric", "loss", "--labels", "a,b"], "plot_log.py: error: --labels needs 1 distinct names, got 'a,b'"),
    (["--metric", "loss", "--out", "/no/such/dir/fig.png"], "plot_log.py: error: --out /no/such/dir/fig.png: no such directory"),
])
def test_plot_log_bad_input_is_one_line(runs, tmp_path, args, message):
    cmd = ["python", "scripts/plot/plot_log.py", str(runs / "mgs.log"), "--out", str(tmp_path / "f.png"), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not (tmp_path / "f.png").exists()
    assert proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_output_shape_hand_values():
    """Two hypotheses of input 0 (reference 5 6 7): 5 6 5 6 5 6 has the 4-grams 5656, 6565,
    5656 (2 unique of 3: rep 1/3); 7 has none (rep 0). EOS (2) and padding (1) are not counted."""
    import torch

    from fairseq_ext.criterions.logged_metrics import output_shape

    hyps = [torch.tensor([5, 6, 5, 6, 5, 6, 2]), torch.tensor([7, 2])]
    refs = [torch.tensor([5, 6, 7, 2]), torch.tensor([9, 2])]
    sums = output_shape(hyps, torch.tensor([0, 0]), refs, special=(2, 1))
    assert sums == {"hyp_len": 7.0, "ref_len": 6.0, "rep4_sum": pytest.approx(1 / 3), "hyps": 2.0}
    assert set(output_shape(hyps, torch.tensor([0, 1]), refs, (2, 1), prefix="greedy_")) == {
        "greedy_hyp_len", "greedy_ref_len", "greedy_rep4_sum", "greedy_hyps"}
    assert output_shape(hyps, torch.tensor([0, 1]), refs, (2, 1))["ref_len"] == 4.0


@pytest.mark.parametrize("criterion", ["mrt", "pg", "mgs"])
def test_length_ratio_and_repetition_are_logged(criterion, runs, toy_bin, tmp_path):
    """Every update logs the candidates' length ratio to the references and their repeated
    4-grams, and validation the greedy output's: length hacking shows during training."""
    if criterion == "mgs":
        log = runs / "mgs.stdout"
    else:
        proc = run_cli(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *TINY, "--criterion", criterion,
                        f"--{criterion}-task-loss", "edit", "--max-update", "2", "--log-interval", "1",
                        "--save-dir", str(tmp_path)], env={"OMP_NUM_THREADS": "1"})
        log = tmp_path / "train.log"
        log.write_text(proc.stdout)
    train, valid = stats_lines(log, "train_inner"), stats_lines(log, "valid")
    assert train and valid
    for record in train:
        assert 0.0 < float(record["len_ratio"]) < 10.0 and 0.0 <= float(record["rep4"]) <= 1.0, record
    for record in valid:
        assert 0.0 < float(record["valid_greedy_len_ratio"]) < 10.0, record
        assert 0.0 <= float(record["valid_greedy_rep4"]) <= 1.0, record
