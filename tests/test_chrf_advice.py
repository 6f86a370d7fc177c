"""The chrF advice agrees with its evidence everywhere: chrF with its default beta 2 weighs recall
twice as much as precision, and trained against it MRT lengthened its outputs and lost BLEU
(docs/task_losses.md, "Length hacking"), so every command in README, docs and examples that
trains on chrF uses chrF with beta 1 (``chrf(beta=1)``), or says on the same line why it keeps
beta 2 (the experiment that measured it). Decoding with chrF (``--mbr-task-loss``,
``--task-loss`` of the scoring script) is not training and is left alone."""
import os
import re

from conftest import REPO

TRAINING = re.compile(r"--(mrt|pg|mgs)-task-loss[ =]+['\"]?([^ \"'`]*)")
BETA_1 = re.compile(r"chrf\(beta=1(\.0)?[,)]")


def _files():
    yield os.path.join(REPO, "README.md")
    for top in ("docs", "examples"):
        for folder, _, names in os.walk(os.path.join(REPO, top)):
            if os.sep + "results" in folder:
                continue  # kept records: what was run, not advice
            for name in names:
                if name.endswith((".md", ".sh", ".py")):
                    yield os.path.join(folder, name)


def unguarded(path: str):
    """(line number, line) of the training commands of ``path`` whose cost spec has a chrF term
    without beta 1 and whose line does not say "beta 2"."""
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        for match in TRAINING.finditer(line):
            terms = re.split(r",(?![^(]*\))", match.group(2))
            plain = [t for t in terms if t.startswith("chrf") and not BETA_1.match(t)]
            if plain and "beta 2" not in line:
                yield number, line.strip()


def test_every_command_that_trains_on_chrf_uses_beta_1_or_says_why_not():
    found = [f"{os.path.relpath(path, REPO)}:{n}: {line}" for path in _files() for n, line in unguarded(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_an_unguarded_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("    fairseq-train bin --criterion mrt --mrt-task-loss chrf\n"
                    "    fairseq-train bin --criterion mgs --mgs-task-loss 'sbleu=1,chrf=0.5'\n"
                    "    fairseq-train bin --criterion mrt --mrt-task-loss 'chrf(beta=1)=1,sbleu=0.5'\n"
                    "    fairseq-train bin --criterion pg --pg-task-loss chrf  # beta 2, the measured control\n"
                    "    fairseq-generate bin --task translation_mbr --mbr-task-loss chrf\n")
    assert [n for n, _ in unguarded(str(page))] == [1, 2]
