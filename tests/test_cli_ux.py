"""What a person sees at the command line (fairseq_ext/runtime/cli.py, fairseq_ext/options.py):
a bad plugin option ends the command with one line naming the option and the
allowed values (exit 2, no traceback, no usage), --help lists the chosen
components' options, and ``python -m fairseq_ext.options`` lists every option of
every plugin component with its default and help."""
import subprocess

import pytest

from conftest import REPO, cli_env, run_cli

TINY = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
    "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "0.001",
    "--max-tokens", "2000", "--max-update", "1", "--num-workers", "0", "--no-save",
]


def run(args, **env):
    return subprocess.run(args, cwd=REPO, env=cli_env(OMP_NUM_THREADS="1", **env), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("bad,last_line", [
    (["--criterion", "mgs", "--mgs-alpha", "0"], "--mgs-alpha must be > 0, got 0.0"),
    (["--criterion", "mgs", "--mgs-task-loss", "nosuchcost"],
     "--mgs-task-loss must be a task loss or a weighted sum of them (sbleu; edit=1,rep=0.5; "
     "my_costs:MyCost=1,sbleu=0.5): 'nosuchcost' is not a task loss (registered: chrf, comet, edit, fluency, "
     "hamming, lm, nonterm, paraphrase, rep, reverse, sbleu; or your own as module:Class)"),
    (["--criterion", "mgs", "--mgs-decoder", "beamsearch"],
     "argument --mgs-decoder: invalid choice: 'beamsearch' (choose from "),
    (["--criterion", "mrt", "--mrt-alpha", "x"], "argument --mrt-alpha: invalid float value: 'x'"),
])
def test_bad_plugin_option_ends_with_one_line(toy_bin, tmp_path, bad, last_line):
    proc = run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--save-dir", str(tmp_path)] + TINY + bad)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert lines[-1].startswith("fairseq-train: error: " + last_line), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr, proc.stderr[-3000:]


def test_bad_task_option_ends_with_one_line(toy_lm_bin, tmp_path):
    proc = run(["fairseq-train", toy_lm_bin, "--user-dir", "fairseq_ext", "--task", "text_completion",
                "--completion-context-size", "0", "--arch", "transformer_lm", "--decoder-layers", "1",
                "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2",
                "--optimizer", "adam",
                "--lr", "0.001", "--max-tokens", "2000", "--max-update", "1", "--no-save", "--save-dir", str(tmp_path)])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "fairseq-train: error: --completion-context-size must be >= 1, got 0"
    assert "Traceback" not in proc.stderr


def test_traceback_on_request(toy_bin, tmp_path):
    proc = run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--save-dir", str(tmp_path)] + TINY
               + ["--criterion", "mgs", "--mgs-alpha", "0"], FAIRSEQ_EXT_TRACEBACK="1")
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "fairseq_ext.runtime.cli.ConfigError: --mgs-alpha must be > 0, got 0.0"


def test_fairseq_errors_keep_fairseq_usage(toy_bin, tmp_path):
    """An error about one of fairseq's own options is left as fairseq prints it."""
    proc = run(["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--save-dir", str(tmp_path)] + TINY
               + ["--lr-scheduler", "nosuch"])
    assert proc.returncode == 2 and "usage:" in proc.stderr
    assert "argument --lr-scheduler: invalid choice: 'nosuch'" in proc.stderr.strip().splitlines()[-1]


def test_help_lists_the_chosen_components_options():
    """fairseq prints --help before it adds the criterion's / task's options."""
    from fairseq_ext.criterions.mgs import MGSConfig
    from fairseq_ext.tasks.translation_mh import TranslationMHConfig

    out = run_cli(["fairseq-train", "--user-dir", "fairseq_ext", "--criterion", "mgs", "--help"]).stdout
    for name in MGSConfig.__dataclass_fields__:
        if name.startswith("mgs_"):
            assert "--" + name.replace("_", "-") in out, name
    out = run_cli(["fairseq-generate", "--user-dir", "fairseq_ext", "--task", "translation_mh", "--help"]).stdout
    for name in TranslationMHConfig.__dataclass_fields__:
        if name.startswith("mh_"):
            assert "--" + name.replace("_", "-") in out, name


def expected_flags():
    """{(kind, name): the flags of every field of its config dataclass}, from fairseq's
    registries filtered to this package (not from fairseq_ext.options)."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    import fairseq_ext  # noqa: F401

    out = {}
    for kind, registry in (("criterion", CRITERION_REGISTRY), ("task", TASK_REGISTRY), ("model", MODEL_REGISTRY)):
        for name, cls in registry.items():
            if not cls.__module__.startswith("fairseq_ext."):
                continue
            config, flags = getattr(cls, "__dataclass"), set()
            for f in config.__dataclass_fields__.values():
                interpolated = isinstance(f.default, str) and f.default.startswith("${")
                if f.name == "_name" or (interpolated and not f.metadata.get("help")):
                    continue  # fairseq's own options (seed, ...), added by fairseq itself
                flags.add("data" if f.name == "data" else "--" + f.name.replace("_", "-"))
            out[kind, name] = flags
    return out


def listed_flags(stdout):
    """{(kind, name): flags} of a ``python -m fairseq_ext.options`` listing: blocks with a
    head line (``--criterion mgs  [...]``, ``--arch a, b  (model m)  [...]``) and option lines
    (``    --flag, -f {choices}  (default: ...)``)."""
    out = {}
    for block in stdout.strip().split("\n\n"):
        head, *rows = block.splitlines()
        kind, name = head.split()[:2]
        key = ("model", head.split("(model ")[1].split(")")[0]) if kind == "--arch" else (kind[2:], name)
        options = [r.strip().split("  (default")[0].split(" {")[0] for r in rows if r[4] != " " and r[:4] == "    "]
        out[key] = {flag for o in options for flag in o.split(", ")}
    return out


def test_options_lists_every_field_of_every_plugin_component():
    proc = run(["python", "-m", "fairseq_ext.options"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed, expected = listed_flags(proc.stdout), expected_flags()
    assert set(listed) == set(expected) and ("criterion", "mgs") in listed
    for key, flags in expected.items():
        assert flags <= listed[key], (key, flags - listed[key])
    assert "RuntimeWarning" not in proc.stderr  # python -m on a module the package imports warns


def test_options_shows_default_rule_and_help(capsys):
    from fairseq_ext import options

    options.main(["mgs", "tagging_lstm_ner"])
    out = capsys.readouterr().out
    assert "--criterion mgs  [fairseq_ext.criterions.mgs]" in out
    assert ("    --mgs-alpha  (default: None; must be > 0)\n"
            "        alpha, temperature of the candidate weights (eq. 2); default: 100 where candidates answer") in out
    assert "    --mgs-mixture  (default: 0.5; must be in [0, 1])\n" in out
    assert "    --mgs-candidates  (default: 4; must be >= 1)\n" in out  # the core's rule (ProposalConfig)
    assert "    --mgs-decoder {greedy,sample,beam}  (default: greedy)\n" in out
    assert "    --mgs-alternate  (default: False)\n" in out  # no rule
    assert "--arch tagging_lstm, tagging_lstm_ner, tagging_lstm_pos, tagging_lstm_tiny  (model tagging_lstm)" in out
    assert "    --encoder-hidden-size  (default: 64; must be >= 1)\n" in out
    assert "--task" not in out
    with pytest.raises(SystemExit) as e:
        options.main(["mgs", "nosuch"])
    assert e.value.code == 2
    assert "no plugin component named nosuch; choose from " in capsys.readouterr().err
