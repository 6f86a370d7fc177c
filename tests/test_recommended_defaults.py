"""The defaults are the recommended settings: each method page's "Recommended settings"
section says which options' defaults are the recommendation ("the defaults are the
recommended settings: `--flag value`, ...") and which one-flag presets stand for a
recommended set ("Preset `--mh-preset translate`: `--flag value`, ..."); this test reads
those sentences and compares them with the defaults the plugin registers (and with the
presets' values), so that page and code cannot drift apart."""
import os
import re

import pytest

from conftest import REPO
from fairseq_ext import options

PAGES = ["docs/dss.md", "docs/mgs.md", "docs/soft_beam.md", "docs/mh_sampler.md", "docs/residual_ebm.md"]
PAIR = re.compile(r"`(--[a-z0-9-]+) ([^`\s]+)`")


def recommended_section(page):
    text = open(os.path.join(REPO, page), encoding="utf-8").read()
    match = re.search(r"^## Recommended settings\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"{page}: no Recommended settings section"
    return match.group(1)


def sentences(section, start):
    """The sentences of ``section`` that begin with ``start`` (case-insensitive), each up to
    its full stop (one followed by a capital letter, or the paragraph's end)."""
    out = []
    for paragraph in re.split(r"\n\s*\n", section):
        flat = " ".join(paragraph.split())
        at = flat.lower().find(start.lower())
        if at >= 0:
            out.append(re.split(r"\.\s+(?=[A-Z])", flat[at:])[0])
    return out


def registered_defaults():
    found = {}
    for component in options.plugin_components():
        for option in options.component_options(component):
            for flag in option.flags:
                found.setdefault(flag, option.default)
    return found


def same(default, written):
    if isinstance(default, bool):
        return str(default).lower() == written.lower()
    try:
        return float(default) == float(written)
    except (TypeError, ValueError):
        return str(default) == written


def declared_defaults():
    return [(page, flag, value) for page in PAGES
            for paragraph in sentences(recommended_section(page), "the defaults are the recommended settings")
            for flag, value in PAIR.findall(paragraph.split(" by task:")[0])]


def test_every_method_page_declares_its_defaults():
    pages = {page for page, _, _ in declared_defaults()}
    assert pages == set(PAGES), set(PAGES) - pages


@pytest.mark.parametrize("page, flag, value", declared_defaults(), ids=lambda x: str(x))
def test_the_registered_default_is_the_recommended_value(page, flag, value):
    defaults = registered_defaults()
    assert flag in defaults, f"{page}: {flag} is not a plugin option"
    assert same(defaults[flag], value), f"{page} recommends {flag} {value}; its default is {defaults[flag]!r}"


def test_mgs_alpha_defaults_by_task_as_its_page_says():
    """``--mgs-alpha`` has no single default: the page's values for translation and text
    completion are the ones the criterion picks."""
    from fairseq_ext.criterions.mgs import default_alpha
    from fairseq_ext.tasks.text_completion import TextCompletionTask

    (paragraph,) = sentences(recommended_section("docs/mgs.md"), "the defaults are the recommended settings")
    by_task = paragraph.split(" by task:")[1]
    mt = re.search(r"`--mgs-alpha ([0-9.]+)` for translation", by_task).group(1)
    lm = re.search(r"`--mgs-alpha ([0-9.]+)` for text completion", by_task).group(1)
    assert default_alpha(object()) == float(mt) == 100.0
    assert default_alpha(TextCompletionTask.__new__(TextCompletionTask)) == float(lm) == 1.0


def test_presets_hold_the_values_their_page_gives():
    from fairseq_ext.tasks.translation_mh import PRESETS

    (paragraph,) = sentences(recommended_section("docs/mh_sampler.md"), "preset `--mh-preset translate`:")
    written = dict(PAIR.findall(paragraph.split(":", 1)[1]))
    preset = {"--" + k.replace("_", "-"): v for k, v in PRESETS["translate"].items()}
    assert written.keys() == preset.keys()
    assert all(same(preset[k], v) for k, v in written.items()), (written, preset)


def test_the_preset_sets_defaults_and_keeps_given_values():
    from omegaconf import OmegaConf

    from fairseq_ext.tasks.translation_mh import TranslationMHConfig, apply_preset

    cfg = OmegaConf.structured(TranslationMHConfig(mh_preset="translate", mh_chains=3))
    apply_preset(cfg)
    assert (cfg.mh_chains, cfg.mh_output, cfg.mh_proposal_temperature, cfg.mh_anneal_floor_at,
            cfg.mh_accept_all_epochs) == (3, "best", 0.8, 0.6, 2)
    plain = OmegaConf.structured(TranslationMHConfig())
    apply_preset(plain)
    assert (plain.mh_chains, plain.mh_output, plain.mh_proposal_temperature) == (1, "final", 1.0)


def test_a_resume_names_the_criterion_options_that_differ_from_the_checkpoint(toy_bin, tmp_path):
    """A run saved with the thesis's DSS setting and resumed with it: nothing; resumed
    without it (so with the defaults): one warning naming both values."""
    from conftest import run_cli
    from fairseq_ext.synthetic import tiny_models

    common = ["fairseq-train", toy_bin, "--user-dir", "fairseq_ext", *tiny_models.TINY_ARCHS["transformer"],
              "--criterion", "differentiable_scheduled_sampling", "--optimizer", "adam", "--lr", "0.001",
              "--max-tokens", "300", "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints",
              "--save-dir", str(tmp_path / "save"), "--seed", "1"]
    thesis = ["--dss-mode", "soft-argmax", "--dss-decay-k", "10"]
    run_cli(common + thesis + ["--max-update", "1"])
    same = run_cli(common + thesis + ["--max-update", "2"])
    assert "resuming " not in same.stdout + same.stderr
    resumed = run_cli(common + ["--max-update", "3"])
    warnings = [line for line in (resumed.stdout + resumed.stderr).splitlines() if "resuming " in line]
    assert len(warnings) == 1, warnings
    assert ("with --dss-mode soft-sample (the checkpoint: soft-argmax), --dss-decay-k 100.0 (the checkpoint: 10.0); "
            "pass the checkpoint's values to continue the run as it was") in warnings[0]
