"""Option names (fairseq_ext/runtime/renamed.py): every option a plugin component
declares begins with that component's prefix, unless it is fairseq's option of
the same name; a renamed option's old spelling still works, with a warning, for
the component that owns it only, on the command line and in a saved checkpoint.
The renamed options are found in the config dataclasses, not listed here."""
import contextlib
import dataclasses
import enum
import io
import os

import pytest
import torch

from conftest import REPO, run_cli_batch
from fairseq_ext.options import plugin_components  # the package import registers them

# The prefix of each plugin component's own options (the naming rule itself); the decoding criteria
# share --decoding-path (decoding/steps.py).
PREFIXES = {
    ("criterion", "mgs"): ("mgs-", "decoding-"),
    ("criterion", "mrt"): ("mrt-", "decoding-"),
    ("criterion", "pg"): ("pg-", "decoding-"),
    ("criterion", "differentiable_scheduled_sampling"): ("dss-", "decoding-"),
    ("criterion", "self_normalized_ce"): ("self-norm-",),
    ("criterion", "soft_beam_direct_loss"): ("soft-beam-", "decoding-"),
    ("criterion", "soft_beam_hinge"): ("soft-beam-", "decoding-"),
    ("criterion", "residual_nce"): ("nce-",),
    ("task", "text_completion"): ("completion-",),
    ("task", "residual_lm"): ("residual-",),
    ("task", "sequence_tagging"): ("tagging-", "search-"),
    ("task", "translation_search"): ("search-",),
    ("task", "translation_mh"): ("mh-",),
    ("task", "translation_mbr"): ("mbr-",),
    ("model", "residual_energy"): ("energy-", "encoder-"),
    ("model", "tagging_lstm"): ("encoder-", "decoder-"),
}


def _fairseq_field_names():
    """The field names of fairseq's own config dataclasses (its common sections and
    every registered fairseq criterion, task and model)."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.models import MODEL_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    names = set()
    configs = [f.type for f in dataclasses.fields(FairseqConfig) if dataclasses.is_dataclass(f.type)]
    for registry in (CRITERION_DATACLASS_REGISTRY, MODEL_DATACLASS_REGISTRY, TASK_DATACLASS_REGISTRY):
        configs += [c for c in registry.values() if c.__module__.startswith("fairseq.")]
    for config in configs:
        names.update(f.name for f in dataclasses.fields(config))
    return names


def _own_fields(component):
    """The fields the plugin's own config classes declare (not those inherited from fairseq's)."""
    config = getattr(component.cls, "__dataclass")
    own = [k for k in config.__mro__ if dataclasses.is_dataclass(k) and k.__module__.startswith("fairseq_ext.")]
    return [f for f in dataclasses.fields(config) if any(f.name in vars(k).get("__annotations__", {}) for k in own)]


def renamed():
    """(component, field, old flag) of every renamed option of every plugin component."""
    from fairseq_ext.runtime.renamed import renamed_fields

    out = []
    for c in plugin_components():
        config = getattr(c.cls, "__dataclass")
        fields = {f.name: f for f in dataclasses.fields(config)}
        out += [(c, fields[name], old) for old, name in renamed_fields(config).items()]
    return out


def test_every_plugin_option_has_its_component_prefix_or_a_fairseq_name():
    from fairseq_ext.runtime.validation import flag

    fairseq_names = _fairseq_field_names()
    checked, wrong = 0, []
    for c in plugin_components():
        prefixes = PREFIXES.get((c.kind, c.name))
        assert prefixes is not None, f"no prefix declared for the {c.kind} {c.name}: add it to PREFIXES"
        for f in _own_fields(c):
            checked += 1
            if f.name not in fairseq_names and not flag(f.name)[2:].startswith(prefixes):
                wrong.append(f"{c.kind} {c.name}: {flag(f.name)} (expected {' or '.join(prefixes)}...)")
    assert checked > 80
    assert not wrong, "\n".join(wrong)


def _value(f):
    """A value for config field ``f`` other than its default, as (command-line words, parsed value)."""
    default = f.default
    if f.type is bool:
        return [], True
    if isinstance(f.type, type) and issubclass(f.type, enum.Enum):  # ChoiceEnum
        choice = next(m for m in f.type._member_names_ if m != str(default))
        return [choice], choice
    if f.type is int:
        return [str(default + 2)], default + 2
    if f.type is float:
        return [str(default + 0.5)], default + 0.5
    return ["renamed-value"], "renamed-value"


def _parse(component, argv):
    """fairseq's parse of ``argv`` for a command that chooses ``component`` (no data is read),
    what it wrote to stderr, and the program name its messages start with."""
    from fairseq import options

    arch = {"text_completion": "transformer_lm", "residual_lm": "residual_energy", "residual_energy": "residual_energy",
            "sequence_tagging": "tagging_lstm_tiny", "tagging_lstm": "tagging_lstm_tiny"}
    task = {"residual_energy": "residual_lm", "tagging_lstm": "sequence_tagging"}
    if component.kind == "criterion":
        head = ["--task", "translation", "--arch", "transformer", "--criterion", component.name]
    else:
        head = ["--task", task.get(component.name, component.name)]
        head += ["--arch", arch[component.name]] if component.name in arch else []
    generate = component.name in ("translation_mh", "translation_search", "translation_mbr")
    parser = options.get_generation_parser() if generate else options.get_training_parser()
    err = io.StringIO()
    _LAST_ERR[0] = ""
    try:
        with contextlib.redirect_stderr(err):
            args = options.parse_args_and_arch(parser, ["data", "--user-dir", os.path.join(REPO, "fairseq_ext"), *head,
                                                        *argv])
    finally:
        _LAST_ERR[0] = err.getvalue()
    return args, err.getvalue(), parser.prog


_LAST_ERR = [""]  # what the last _parse wrote to stderr (also when it exited)


def _refusal(component, argv):
    """(exit code, stderr) of fairseq's parse of ``argv`` for ``component``."""
    try:
        _parse(component, argv)
    except SystemExit as e:
        return e.code, _LAST_ERR[0]
    return 0, _LAST_ERR[0]


def test_each_old_spelling_on_the_command_line_names_the_new_one():
    """With its component chosen, an old flag (``--old VALUE`` and ``--old=VALUE``) stops the parse
    with one line naming the new spelling (exit 2); the new spelling parses."""
    cases = renamed()
    assert {c.kind for c, _, _ in cases} == {"criterion", "task", "model"}
    assert {"--normalization", "--hamming-weights", "--tag-column", "--base-lm"} <= {old for *_, old in cases}
    from fairseq_ext.runtime.validation import flag

    for component, f, old in cases:
        words, value = _value(f)
        for argv in ([old, *words], [f"{old}={words[0]}"] if words else [old]):
            code, err = _refusal(component, argv)
            lines = err.strip().splitlines()
            assert code == 2 and lines[-1].endswith(f"error: {old} was renamed {flag(f.name)}"), (old, err)
        new_args, err, _ = _parse(component, [flag(f.name), *words])
        assert getattr(new_args, f.name) == value and "renamed" not in err


def test_old_spelling_belongs_to_its_component_only():
    """Another component keeps its own meaning of the old name (fairseq's wav2vec has
    --num-negatives); an unchosen component's old name is not refused; nothing after --."""
    from fairseq import options

    from fairseq_ext.runtime.renamed import refuse_old_spellings

    parser = options.get_training_parser()
    for argv in (["d", "--task", "audio_pretraining", "--arch", "wav2vec2", "--num-negatives", "3"],
                 ["d", "--task", "translation", "--criterion", "mgs", "--normalization", "global"],
                 ["d", "--task", "sequence_tagging", "--", "--cache-dir", "x"],
                 ["d", "--cache-dir", "x", "--task"]):  # malformed: left to fairseq's parser to report
        refuse_old_spellings(argv, parser)
    # a script's parser that sets the task by default (get_generation_parser(default_task=...))
    parser = options.get_generation_parser(default_task="residual_lm")
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()) as err:
        refuse_old_spellings(["d", "--base-lm", "lm.pt"], parser)
    assert e.value.code == 2 and "--base-lm was renamed --residual-base-lm" in err.getvalue()


def test_fairseq_train_refuses_an_old_spelling_before_any_work(conll, tmp_path):
    """Through the console command: one line naming the new option, exit 2, nothing written."""
    save = tmp_path / "ck"
    argv = ["fairseq-train", conll, "--user-dir", "fairseq_ext", "--task", "sequence_tagging", "--tagging-cache-dir",
            str(tmp_path / "cache"), "--arch", "tagging_lstm_tiny", "--optimizer", "adam", "--lr", "0.01",
            "--max-update", "1", "--save-dir", str(save)]
    r, = run_cli_batch([argv + ["--tag-column", "pos"]], tmp_path)
    lines = r["stderr"].strip().splitlines()
    assert r["rc"] == 2 and lines[-1] == "fairseq-train: error: --tag-column was renamed --tagging-column"
    assert not save.exists()


def test_checkpoint_saved_with_old_option_names_loads_with_their_values(tmp_path):
    """A checkpoint whose saved task config has the old keys: fairseq's load keeps their
    values under the new names (its merge with the config class would drop them and
    take the defaults), and ``arg_overrides`` of a new name apply."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import merge_with_parent

    import fairseq_ext  # noqa: F401  (its checkpoint loading)
    from fairseq_ext.tasks.sequence_tagging import SequenceTaggingConfig

    path = tmp_path / "old.pt"
    torch.save({"cfg": {"task": {"_name": "sequence_tagging", "data": "d", "tag_column": "pos", "lowercase": True,
                                 "cache_dir": "/old/cache", "tagging_search": "soft"},
                        "criterion": {"_name": "soft_beam_hinge", "normalization": "global", "hamming_weights": "O=2"},
                        "model": {"_name": "tagging_lstm_tiny", "unidirectional": True}},
                "model": {}, "extra_state": {"epoch": 1},
                "optimizer_history": [{"criterion_name": "SoftBeamHingeCriterion", "optimizer_name": "FairseqAdam",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path), {"tagging_cache_dir": "/new/cache"})
    task = merge_with_parent(SequenceTaggingConfig(), state["cfg"].task, remove_missing=True)
    assert (task.tagging_column, task.tagging_lowercase, task.search_algorithm) == ("pos", True, "soft")
    assert task.tagging_cache_dir == "/new/cache"
    assert dict(state["cfg"].criterion) == {"_name": "soft_beam_hinge", "soft_beam_normalization": "global",
                                            "soft_beam_hamming_weights": "O=2"}
    assert dict(state["cfg"].model) == {"_name": "tagging_lstm_tiny", "encoder_unidirectional": True}


def test_every_old_spelling_loads_from_a_checkpoint_saved_with_it(tmp_path):
    """Each old spelling, one by one: a checkpoint whose saved config of the component has the old
    key loads with its value under the new name, the old key gone (what a checkpoint saved before
    the rename needs; fairseq's merge with the config class would drop an unknown key and take the
    default)."""
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401  (its checkpoint loading)
    from fairseq_ext.runtime.renamed import _flag_name

    cases = renamed()
    assert len(cases) >= 20
    section = {"task": "task", "criterion": "criterion", "model": "model"}
    for i, (component, f, old) in enumerate(cases):
        _, value = _value(f)
        name = component.archs[0] if component.kind == "model" else component.name
        cfg = {"task": {"_name": "translation", "data": "d"}, "criterion": {"_name": "cross_entropy"},
               "model": {"_name": "transformer"}}
        cfg[section[component.kind]] = {"_name": name, _flag_name(old): value}
        path = tmp_path / f"old{i}.pt"
        torch.save({"cfg": cfg, "model": {}, "extra_state": {"epoch": 1},
                    "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                           "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, path)
        saved = checkpoint_utils.load_checkpoint_to_cpu(str(path))["cfg"][section[component.kind]]
        assert saved.get(f.name) == value and _flag_name(old) not in saved, (component.name, old, dict(saved))
