"""Every bad option or input ends the command with one line, exit status 2, before
any work (fairseq_ext/runtime/validation.py, fairseq_ext/runtime/checkpoints.py):

* every option of a plugin criterion, task or model (the generators are configured
  through their tasks) that declares a constraint, found in the config
  dataclasses, gets each value just outside what it allows; the last line of
  stderr names the option, and the command stopped while parsing (before fairseq
  creates --save-dir);
* residual_nce on data without negatives is refused before training starts;
* a data directory or split that does not exist, a checkpoint that does not load
  and a checkpoint trained with another dictionary are named in one line.

The option commands stop while parsing: they run as forks of one process that
imported the plugin once (conftest.run_cli_batch)."""
import dataclasses
import inspect
import os
import re
import shutil
import subprocess
from typing import Optional

import pytest

from conftest import REPO, cli_env, run_cli, run_cli_batch
from fairseq_ext.options import plugin_components  # the package import registers them
from fairseq_ext.synthetic import tiny_models

TRANSFORMER = tiny_models.TINY_ARCHS["transformer"]
LM_ARCH = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-output-dim",
           "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2"]
TRAIN = ["--user-dir", "fairseq_ext", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "2000", "--max-update",
         "1", "--num-workers", "0", "--seed", "1"]


def command(component, data, tmp):
    """A fairseq command that chooses ``component`` (the rest valid), as (argv, save dir or None)."""
    save = str(tmp / "ck")
    train = ["fairseq-train"]
    tagging = [data["conll"], "--task", "sequence_tagging", "--tagging-cache-dir", str(tmp / "cache")]
    residual = [data["lm"], "--task", "residual_lm", "--residual-base-lm", str(tmp / "base.pt"), "--arch",
                "residual_energy"]
    contexts = {
        ("task", "text_completion"): train + [data["lm"], "--task", "text_completion"] + LM_ARCH,
        ("task", "sequence_tagging"): train + tagging + ["--arch", "tagging_lstm_tiny"],
        ("task", "residual_lm"): train + residual,
        ("task", "translation_mh"): ["fairseq-generate", data["bin"], "--task", "translation_mh", "--path",
                                     str(tmp / "cmlm.pt")],
        ("task", "translation_search"): ["fairseq-generate", data["bin"], "--task", "translation_search", "--path",
                                         str(tmp / "model.pt")],
        ("task", "translation_mbr"): ["fairseq-generate", data["bin"], "--task", "translation_mbr", "--path",
                                      str(tmp / "model.pt")],
        ("model", "tagging_lstm"): train + tagging + ["--arch", "tagging_lstm_tiny"],
        ("model", "residual_energy"): train + residual,
    }
    if component.kind == "criterion":
        argv = train + [data["bin"], "--task", "translation"] + TRANSFORMER + ["--criterion", component.name]
    else:
        argv = contexts.get((component.kind, component.name))
        assert argv is not None, f"no command for the {component.kind} {component.name}: add one to command()"
    if argv[0] == "fairseq-train":
        argv = argv + TRAIN + ["--save-dir", save]
        return argv, save
    return argv + ["--user-dir", "fairseq_ext"], None


def violations(f, constraint):
    """Values of config field ``f`` just outside what ``constraint`` allows (as typed on the command line)."""
    from fairseq_ext.core.constraints import OneOf, Range, Rule

    if isinstance(constraint, OneOf):
        return ["nosuch"]
    if isinstance(constraint, Rule):
        return [constraint.counterexample]
    assert isinstance(constraint, Range), constraint
    step = 1 if f.type in (int, Optional[int]) else 0.5
    out = []
    if constraint.low is not None:
        out.append(constraint.low if constraint.low_open else constraint.low - step)
    if constraint.high is not None:
        out.append(constraint.high if constraint.high_open else constraint.high + step)
    return out


def constrained():
    """(component, field, constraint) of every plugin option that declares a constraint."""
    from fairseq_ext.runtime.validation import constrained_options

    return [(c, f, k) for c in plugin_components() for f, k in constrained_options(getattr(c.cls, "__dataclass"))]


def test_every_constrained_option_is_refused_in_one_line(toy_bin, toy_lm_bin, conll, tmp_path):
    from fairseq_ext.runtime.validation import flag

    data = {"bin": toy_bin, "lm": toy_lm_bin, "conll": conll}
    cases = []
    for i, (component, f, constraint) in enumerate(constrained()):
        for j, value in enumerate(violations(f, constraint)):
            tmp = tmp_path / f"{i}-{j}"
            tmp.mkdir()
            argv, save = command(component, data, tmp)
            cases.append((component, flag(f.name), value, argv + [flag(f.name), str(value)], save))
    # every kind of component is covered, and the explicit cases of the bug report among them
    assert {c.kind for c, *_ in cases} == {"criterion", "task", "model"}
    assert {("--mgs-candidates", 0), ("--mgs-mixture", 1.5)} <= {(fl, v) for _, fl, v, _, _ in cases}
    results = run_cli_batch([argv for *_, argv, _ in cases], tmp_path)
    failures = []
    for (component, option, value, argv, save), r in zip(cases, results):
        prog = argv[0]
        last = r["stderr"].strip().splitlines()[-1] if r["stderr"].strip() else ""
        ok = (r["rc"] == 2 and "Traceback" not in r["stderr"]
              and (last.startswith(f"{prog}: error: {option} must be ")
                   or last.startswith(f"{prog}: error: argument {option}: invalid choice: 'nosuch'"))
              and (save is None or not os.path.exists(save)))  # refused before fairseq made --save-dir
        if not ok:
            failures.append(f"{component.kind} {component.name} {option} {value}: rc {r['rc']}, last line {last!r}")
    assert not failures, "\n".join(failures)


def test_each_option_names_a_real_core_parameter():
    """A ``parameter`` link names a field of a core dataclass or an argument of a core
    function or class, and a choice option offers only values the core accepts."""
    from fairseq_ext.core.constraints import OneOf
    from fairseq_ext.runtime.validation import PARAMETER, option_constraint

    links = 0
    for component in plugin_components():
        for f in dataclasses.fields(getattr(component.cls, "__dataclass")):
            if PARAMETER not in f.metadata:
                continue
            owner, name = f.metadata[PARAMETER]
            links += 1
            if dataclasses.is_dataclass(owner):
                assert name in owner.__dataclass_fields__, (f.name, owner, name)
            else:
                assert name in inspect.signature(owner).parameters, (f.name, owner, name)
            choices = getattr(f.type, "_member_names_", None)  # a ChoiceEnum
            constraint = option_constraint(f)
            if choices is not None and isinstance(constraint, OneOf):
                assert set(choices) <= set(constraint.choices), (f.name, choices, constraint)
    assert links > 30


def test_core_parameter_errors_are_named_as_options():
    """A rule of the core that ties parameters together names both as options."""
    from fairseq_ext.core.constraints import ParameterError
    from fairseq_ext.core.mcmc import MHConfig
    from fairseq_ext.runtime.cli import ConfigError
    from fairseq_ext.runtime.validation import as_options
    from fairseq_ext.tasks.translation_mh import TranslationMHConfig

    with pytest.raises(ConfigError, match=r"^--mh-target-anneal and --mh-anneal-floor-at are two annealing "
                                          r"schedules: give one, got 0.02 and 0.5$"):
        with as_options(TranslationMHConfig):
            MHConfig(target_anneal=0.02, anneal_floor_at=0.5).check()
    with pytest.raises(ParameterError, match="^target_anneal and anneal_floor_at"):  # the core alone: parameters
        MHConfig(target_anneal=0.02, anneal_floor_at=0.5).check()
    with pytest.raises(ConfigError, match=r"^--mh-energy must be one of \('raw', 'local'\), got '\{0\}'$"):
        with as_options(TranslationMHConfig):  # a value is shown as it is, braces and all
            MHConfig(energy="{0}").check()


@pytest.mark.parametrize("bad,last_line", [
    (["--mgs-candidates", "0"], "--mgs-candidates must be >= 1, got 0"),
    (["--mgs-mixture", "1.5"], "--mgs-mixture must be in [0, 1], got 1.5"),
])
def test_mgs_proposal_options(toy_bin, tmp_path, bad, last_line):
    """Checked in the core (ProposalConfig), they escaped as a 53-line traceback, exit 1."""
    save = tmp_path / "ck"
    proc = subprocess.run(["fairseq-train", toy_bin, "--task", "translation", *TRANSFORMER, "--criterion", "mgs",
                           *TRAIN, "--save-dir", str(save), *bad], cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == f"fairseq-train: error: {last_line}"
    assert "Traceback" not in proc.stderr
    assert not save.exists()


# ---------------------------------------------------------------- input mistakes

@pytest.fixture(scope="module")
def lm_checkpoint(toy_lm_bin, tmp_path_factory):
    """A tiny transformer_lm trained for one update on the toy lines."""
    save = tmp_path_factory.mktemp("lm")
    run_cli(["fairseq-train", toy_lm_bin, "--task", "language_modeling", "--tokens-per-sample", "32", *LM_ARCH,
             *TRAIN, "--save-dir", str(save), "--no-epoch-checkpoints", "--disable-validation"])
    return str(save / "checkpoint_last.pt")


@pytest.fixture(scope="module")
def other_dictionary(toy_lm_bin, tmp_path_factory):
    """The toy lines with 20 more words in the dictionary (a model built on it is larger)."""
    data = tmp_path_factory.mktemp("other_dict") / "data"
    shutil.copytree(toy_lm_bin, data)
    with open(data / "dict.txt", "a") as f:
        f.writelines(f"extraword{i} 1\n" for i in range(20))
    return str(data)


@pytest.fixture(scope="module")
def mistakes(toy_lm_bin, lm_checkpoint, other_dictionary, tmp_path_factory):
    """{case: (result, save dir)} of every input mistake, run in one batch."""
    tmp = tmp_path_factory.mktemp("mistakes")
    (tmp / "truncated.pt").write_bytes(open(lm_checkpoint, "rb").read()[:1000])
    (tmp / "text.pt").write_text("not a checkpoint\n")
    (tmp / "no_negatives").mkdir()
    # commands that choose a plugin component (the task text_completion): the plugin's one-line errors
    lm = ["--task", "text_completion", "--tokens-per-sample", "32", *LM_ARCH]
    generate = ["fairseq-generate", "--user-dir", "fairseq_ext", "--task", "text_completion", "--batch-size", "4"]
    cases = {
        "no data directory": ["fairseq-train", str(tmp / "nosuch"), *lm],
        "no split": ["fairseq-train", toy_lm_bin, *lm, "--valid-subset", "nosuch"],
        "truncated restore file": ["fairseq-train", toy_lm_bin, *lm, "--restore-file", str(tmp / "truncated.pt")],
        "other dictionary, fine-tune": ["fairseq-train", other_dictionary, *lm, "--finetune-from-model",
                                        lm_checkpoint],
        "no path": generate + [toy_lm_bin, "--path", str(tmp / "nosuch.pt")],
        "path not a checkpoint": generate + [toy_lm_bin, "--path", str(tmp / "text.pt")],
        "other dictionary, generate": generate + [other_dictionary, "--path", lm_checkpoint],
        "residual_nce without negatives": ["fairseq-train", toy_lm_bin, "--task", "residual_lm", "--residual-base-lm",
                                           lm_checkpoint, "--residual-negatives-dir", str(tmp / "no_negatives"),
                                           "--residual-prefix-len", "8", "--residual-continuation-len", "4", "--arch",
                                           "residual_energy", "--encoder-layers", "1", "--encoder-embed-dim", "16",
                                           "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
                                           "--criterion", "residual_nce", "--batch-size", "8"],
    }
    commands, saves = [], {}
    for i, (case, argv) in enumerate(cases.items()):
        if argv[0] == "fairseq-train":
            saves[case] = str(tmp / f"ck{i}")
            argv = argv + TRAIN + ["--save-dir", saves[case]]
        commands.append(argv)
    traceback = {"argv": commands[list(cases).index("other dictionary, generate")],
                 "env": {"FAIRSEQ_EXT_TRACEBACK": "1"}}
    results = run_cli_batch(commands + [traceback], tmp)
    out = {case: (r, saves.get(case)) for case, r in zip(cases, results)}
    out["traceback on request"] = (results[-1], None)
    return str(tmp), out


@pytest.mark.parametrize("case,message", [
    ("no data directory", r"{tmp}/nosuch: no such data directory"),
    ("no split", r"split nosuch: text_completion: dataset not found: nosuch \({data}/nosuch\.bin/\.idx\)"),
    ("truncated restore file", r"{tmp}/truncated.pt: cannot load it as a checkpoint \(RuntimeError: .*zip archive"),
    ("other dictionary, fine-tune", r"{ckpt}: the checkpoint's dictionary has (\d+) entries, the data's (\d+): "
                                    r"it was trained with another dictionary \(size mismatch for decoder\.embed_tokens"),
    ("no path", r"{tmp}/nosuch.pt: no such checkpoint file"),
    ("path not a checkpoint", r"{tmp}/text.pt: cannot load it as a checkpoint \(UnpicklingError"),
    ("other dictionary, generate", r"{ckpt}: the checkpoint's dictionary has (\d+) entries, the data's (\d+): "),
    ("residual_nce without negatives", r"--criterion residual_nce needs the negatives of split valid, but there is "
                                       r"no {tmp}/no_negatives/valid.negatives.pt: run scripts/prepare/sample_negatives.py"),
])
def test_input_mistakes_end_in_one_line(mistakes, lm_checkpoint, toy_lm_bin, case, message):
    tmp, results = mistakes
    result, save = results[case]
    prog = "fairseq-train" if save is not None else "fairseq-generate"
    expected = message.format(tmp=re.escape(tmp), ckpt=re.escape(lm_checkpoint), data=re.escape(toy_lm_bin))
    assert result["rc"] == 2, result["stderr"][-3000:]
    last = result["stderr"].strip().splitlines()[-1]
    match = re.match(f"{prog}: error: {expected}", last)
    assert match, last
    assert "Traceback" not in result["stderr"], result["stderr"][-3000:]
    if save is not None:  # nothing written: no checkpoint, no crash.pt
        assert not os.path.exists(save) or os.listdir(save) == [], os.listdir(save)
    if match.groups():  # the real dictionary sizes: the checkpoint's, then the larger data's
        assert int(match.group(1)) < int(match.group(2))


def test_traceback_on_request(mistakes):
    result, _ = mistakes[1]["traceback on request"]
    assert result["rc"] == 1 and "Traceback" in result["stderr"]
    assert "size mismatch for decoder.embed_tokens.weight" in result["stderr"]  # the cause, chained
    assert result["stderr"].strip().splitlines()[-1].startswith("fairseq_ext.runtime.checkpoints.ModelMismatch: ")


def test_a_misspelled_plugin_option_is_one_line_with_the_closest_names(toy_bin, tmp_path):
    """``--mrt-candiates``: one line, exit 2, the closest plugin options first; nothing written.
    An unknown option without a plugin prefix keeps fairseq's usage and error."""
    train = ["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", "--arch", "transformer", "--optimizer", "adam",
             "--lr", "0.1", "--max-tokens", "100", "--cpu"]
    results = run_cli_batch([train + ["--criterion", "mrt", "--mrt-candiates", "4", "--save-dir", str(tmp_path / "a")],
                             train + ["--criterion", "differentiable_scheduled_sampling", "--dss-warmpu-updates=3", "--save-dir", str(tmp_path / "b")],
                             train + ["--bogus-option", "3", "--save-dir", str(tmp_path / "c")]], tmp_path)
    first, second, plain = (r["stderr"].strip().splitlines() for r in results)
    assert [r["rc"] for r in results] == [2, 2, 2]
    assert first == ["fairseq-train: error: unrecognized option --mrt-candiates (did you mean --mrt-candidates or "
                     "--mbr-candidates or --mgs-candidates?)"], first
    assert second[-1].startswith("fairseq-train: error: unrecognized option --dss-warmpu-updates (did you mean "
                                 "--dss-warmup-updates"), second
    assert len(plain) > 20 and plain[0].startswith("usage: fairseq-train")
    assert plain[-1] == "fairseq-train: error: unrecognized arguments: --bogus-option 3"
    assert not any(os.path.exists(tmp_path / d) for d in "abc")
