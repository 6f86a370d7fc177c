"""Every command the docs show parses: the code blocks (fenced or indented) of the
README, docs/*.md and the experiments' READMEs under examples/ are read, and each command that starts
with ``fairseq-train``, ``fairseq-generate``, ``python -m fairseq_ext...``,
``python scripts/...`` or ``bash examples/...`` is checked as a user would run it,
without training: fairseq's parser with the plugin loaded takes every option of a
fairseq command (a renamed option or a typo on a page fails here), the options
listing knows every name it is given, and a script or recipe the page names exists.

Shell syntax is read as far as the pages use it: ``\\`` continuations, variables
set earlier in the same block (``T="--task ..."``; others become a placeholder
word; ``$(fairseq-ext-dir)``, the one way the pages give ``--user-dir``, is the package's
directory), environment settings before a command (``DATA=d MLE=m bash ...``; ``PYTHONPATH=DIR`` puts
DIR on the import path while the command parses, for the user's own cost modules), files
written by an earlier line of the block, and a command ends at ``|``, ``>``, ``&&``,
``;`` or ``#``. ``...`` stands for options the page leaves out: such a fragment may
leave out the architecture (its options are parsed with fairseq's transformer), a
whole command may not."""
import contextlib
import io
import os
import re
import shlex
import sys
from typing import Dict, Iterator, List, NamedTuple

import pytest

from conftest import REPO, USER_PAGES

PAGES = USER_PAGES
STARTS = ("fairseq-train", "fairseq-generate", "python -m fairseq_ext", "python scripts/", "bash examples/")
ENDS = {"|", ">", ">>", "2>", "&&", "||", ";", "&"}
PLACEHOLDER = "X"
USER_DIR = "$(fairseq-ext-dir)"  # how every page loads the plugin (bin/fairseq-ext-dir)


class Command(NamedTuple):
    page: str
    line: int
    words: List[str]
    elided: bool = False  # the page wrote ... for options it leaves out
    written: frozenset = frozenset()  # files the block's earlier lines write (``git show ... > FILE``)
    pythonpath: tuple = ()  # PYTHONPATH=DIR before the command: where the user's own modules are

    def __str__(self):
        return f"{self.page}:{self.line}: {' '.join(self.words)}"


def code_blocks(text: str) -> Iterator[List[tuple]]:
    """The code blocks of a markdown page, each as a list of (line number, line)."""
    block, fenced, lines = [], False, text.splitlines()
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            if fenced:
                yield block
                block = []
            fenced = not fenced
            continue
        if fenced:
            block.append((i, line))
        elif line.startswith("    ") and (block or not lines[i - 2].strip() or lines[i - 2].startswith("    ")):
            block.append((i, line[4:]))
        elif block and not line.strip():
            block.append((i, ""))
        elif block:
            yield block
            block = []
    if block:
        yield block


VARIABLE = r"\$\{?(\w+)(?:\[@\])?\}?"  # $NAME, ${NAME}, ${NAME[@]} (a bash array)


def _expand(word: str, variables: Dict[str, str]) -> List[str]:
    """A word with its variables replaced: a variable set in the block splits into its
    words when it is the whole word; any other becomes the placeholder."""
    whole = re.fullmatch(VARIABLE, word)
    if whole and whole.group(1) in variables:
        return shlex.split(variables[whole.group(1)])
    return [re.sub(VARIABLE, lambda m: variables.get(m.group(1), PLACEHOLDER), word)]


def commands(page: str, text: str = None) -> Iterator[Command]:
    """The commands of ``page`` (its ``text`` when given, else the file in the repository)."""
    if text is None:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = f.read()
    for block in code_blocks(text):
        variables: Dict[str, str] = {}
        written = set()
        joined, start = "", None
        for number, line in block + [(0, "")]:
            if start is None:
                start = number
            joined += line.rstrip()
            if joined.endswith("\\"):
                joined = joined[:-1] + " "
                continue
            source, joined, first = joined.strip(), "", start
            start = None
            prefix = re.match(r"(?:\w+=\S+\s+)+", source)  # NAME=VALUE ... COMMAND: the command's environment
            pythonpath = ()
            if prefix and source[prefix.end():].startswith(STARTS):
                env = dict(item.split("=", 1) for item in prefix.group(0).split())
                pythonpath = tuple(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
                source = source[prefix.end():]
            assignment = re.fullmatch(r"(\w+)=(.*)", source)
            if assignment:
                value = assignment.group(2)
                if value.startswith("(") and value.endswith(")"):  # a bash array
                    value = value[1:-1]
                try:
                    variables[assignment.group(1)] = " ".join(shlex.split(value))
                except ValueError:
                    pass
                continue
            written.update(re.findall(r">\s*([\w./-]+)", source))
            if not source.startswith(STARTS) or source.split()[0].endswith(":"):  # an error line it shows
                continue
            try:
                lexer = shlex.shlex(source, posix=True, punctuation_chars="|&;<>")
                lexer.whitespace_split = True
                lexer.commenters = "#"
                tokens = list(lexer)
            except ValueError:
                raise AssertionError(f"{page}:{first}: cannot read {source!r} as a shell command")
            words, elided = [], "..." in tokens
            for i, token in enumerate(tokens):
                redirect = (token.isdigit() and i + 1 < len(tokens) and tokens[i + 1].startswith((">", "<"))
                            and re.search(rf"(?<!\S){token}[<>]", source))  # 2>&1, not "--beam 3 > out"
                if token in ENDS or token.startswith((">", "<", "|")) or redirect:
                    break
                if token != "...":
                    words += _expand(token, variables)
            yield Command(page, first, words, elided, frozenset(written), pythonpath)


def all_commands() -> List[Command]:
    return [c for page in PAGES for c in commands(page)]


def _parse(command: Command) -> str:
    """fairseq's parse of a fairseq command with the plugin loaded, in this process;
    returns what went wrong ("" when it parsed)."""
    from fairseq import options

    import fairseq_ext  # noqa: F401

    program, argv = command.words[0], list(command.words[1:])
    if "--user-dir" in argv:  # as the page runs it: the installed package's directory
        at = argv.index("--user-dir") + 1
        if argv[at] != USER_DIR:
            return f"--user-dir {argv[at]}: load the plugin with --user-dir \"{USER_DIR}\" (works from any directory)"
        argv[at] = os.path.join(REPO, "fairseq_ext")
    else:
        argv += ["--user-dir", os.path.join(REPO, "fairseq_ext")]
    if program == "fairseq-train" and not {"--arch", "-a", "--help", "-h"} & set(argv):
        if not command.elided:
            return "no --arch: fairseq-train needs one (spell the architecture out on the page)"
        lm = {"text_completion", "language_modeling"} & set(argv)
        argv = argv + ["--arch", "transformer_lm" if lm else "transformer"]  # a fragment: its options still parse
    parser = options.get_training_parser() if program == "fairseq-train" else options.get_generation_parser()
    err = io.StringIO()
    own = [os.path.join(REPO, p) for p in command.pythonpath]  # the page's PYTHONPATH=DIR, from the repository root
    own.append(os.path.join(REPO, "tests", "stand_ins"))  # optional packages a page installs (unbabel-comet)
    sys.path[:0] = own
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            options.parse_args_and_arch(parser, argv)
    except SystemExit as e:
        if e.code == 0 and ("--help" in argv or "-h" in argv):
            return ""
        lines = [line for line in err.getvalue().splitlines() if "error" in line]
        if lines and re.search(rf"invalid (\w+ value|choice): '{PLACEHOLDER}'", lines[-1]):
            return ""  # the value is a shell variable on the page; the option itself is known
        return lines[-1] if lines else f"exit {e.code}"
    except Exception as e:  # a ConfigError of a declared rule, fairseq's own checks
        return f"{type(e).__name__}: {e}"
    finally:
        del sys.path[:len(own)]
    return ""


def check(command: Command) -> str:
    program = command.words[0]
    if program in ("fairseq-train", "fairseq-generate"):
        return _parse(command)
    if program == "bash":
        script = command.words[1]
        known = os.path.isfile(os.path.join(REPO, script)) or script in command.written
        return "" if known else f"no such recipe {script}"
    if command.words[1] == "-m":
        if command.words[2] == "fairseq_ext.options":
            from fairseq_ext import options

            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    options.main([w for w in command.words[3:] if w != PLACEHOLDER])
                except SystemExit as e:
                    return f"python -m fairseq_ext.options: exit {e.code}"
            return ""
        module = command.words[2]
        if module == "fairseq_ext.finetune" and command.words[3:4] == ["fairseq-train"]:  # a wrapped command
            return _parse(command._replace(words=command.words[3:]))
        path = os.path.join(REPO, *module.split("."))
        return "" if os.path.isfile(path + ".py") or os.path.isdir(path) else f"no such module {module}"
    script = command.words[1]
    return "" if os.path.isfile(os.path.join(REPO, script)) else f"no such script {script}"


def test_the_pages_show_commands():
    found = all_commands()
    by_program = {c.words[0] for c in found}
    assert {"fairseq-train", "fairseq-generate", "python", "bash"} <= by_program
    assert sum(c.words[0].startswith("fairseq-") for c in found) >= 35


def test_reader_splits_continuations_and_variables():
    page = ("Text.\n\n    T=\"--task residual_lm --residual-prefix-len 8\"\n"
            "    fairseq-train bin $T --arch residual_energy \\\n      --save-dir $W/ebm ... | tee log\n\n"
            "```\nfairseq-generate bin --path ck.pt --beam 3 > out  # greedy\nls\n```\n"
            "and in text `fairseq-train nothing`\n")
    found = list(commands("page.md", page))
    assert [(c.line, c.words) for c in found] == [
        (4, ["fairseq-train", "bin", "--task", "residual_lm", "--residual-prefix-len", "8", "--arch",
             "residual_energy", "--save-dir", "X/ebm"]),
        (8, ["fairseq-generate", "bin", "--path", "ck.pt", "--beam", "3"])]
    assert check(found[0]) == "" and check(found[1]) == ""
    assert check(Command("p", 1, ["fairseq-train", "bin", "--arch", "lstm", "--mgs-alpha", "1"])).endswith(
        "unrecognized option --mgs-alpha (an option of --criterion mgs, which this command does not select)")
    assert check(Command("p", 1, ["fairseq-train", "bin", "--task", "sequence_tagging", "--arch", "tagging_lstm_tiny",
                                  "--tag-column", "ner"])).endswith("error: --tag-column was renamed --tagging-column")
    # the plugin is loaded the one documented way, which works from any directory
    assert check(Command("p", 1, ["fairseq-generate", "bin", "--user-dir", "fairseq_ext", "--path", "a.pt"])) == (
        '--user-dir fairseq_ext: load the plugin with --user-dir "$(fairseq-ext-dir)" (works from any directory)')
    assert check(Command("p", 1, ["fairseq-generate", "bin", "--user-dir", USER_DIR, "--path", "a.pt"])) == ""


@pytest.mark.parametrize("command", all_commands(), ids=str)
def test_documented_command_parses(command):
    problem = check(command)
    assert not problem, f"{command}\n  -> {problem}"
