"""Reading ``fairseq-generate`` output: the one reader every script, experiment and test uses.

fairseq-generate prints, per sentence id, ``S-id<TAB>source``, ``T-id<TAB>reference``,
``H-id<TAB>score<TAB>hypothesis`` (one per n-best entry), ``D-id<TAB>score<TAB>detokenized``
and ``P-id<TAB>positional scores``, mixed with log lines. ``parse`` collects those lines by
kind and id; ``read_generate_output`` aligns the first hypothesis of every id with its
reference and source.
"""
from __future__ import annotations

import gzip
import os
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, TextIO, Union

from fairseq_ext.runtime.cli import ConfigError

KINDS = ("S", "T", "H", "D", "P")
_SCORED = ("H", "D")  # kinds whose text follows a score column


class GenerateOutputError(ConfigError):
    """Generate output that cannot be read; the message names the file."""


@dataclass
class Generated:
    """One fairseq-generate run, sorted by sentence id, first hypothesis of each id.

    ``hypotheses``: the D- text where the output has D- lines, else the H- text;
    ``raw``: the H- text (the decoder's tokens); ``references``: T-; ``sources``: S-
    ("" where absent)."""

    ids: List[int]
    hypotheses: List[str]
    raw: List[str]
    references: List[str]
    sources: List[str]


def parse(lines: Union[str, Iterable[str]], keep_scores: bool = False) -> Dict[str, Dict[int, List[str]]]:
    """{kind: {sentence id: [text of each line of that kind, in order]}} for the kinds
    S, T, H, D, P. The score column of H- and D- lines is dropped (kept, as
    ``score<TAB>text``, with ``keep_scores``); other lines are ignored. ``lines``: a
    whole output as one string, or an iterable of lines."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    fields: Dict[str, Dict[int, List[str]]] = {kind: {} for kind in KINDS}
    for line in lines:
        kind, sep, rest = line.rstrip("\n").partition("-")
        if kind not in fields or not sep:
            continue
        sid, _, text = rest.partition("\t")
        if not sid.isdigit():
            continue
        if kind in _SCORED and not keep_scores:
            text = text.partition("\t")[2]
        fields[kind].setdefault(int(sid), []).append(text)
    return fields


def read_generate_output(lines: Union[str, Iterable[str]], name: str = "generate output") -> Generated:
    """The sentences of one output (see ``Generated``). GenerateOutputError, naming
    ``name``, when there is no H- line or an id lacks its T- (or, with D- lines, D-) line."""
    fields = parse(lines)
    raw = fields["H"]
    if not raw:
        raise GenerateOutputError(f"{name}: no H- lines; is this fairseq-generate output?")
    hyps = fields["D"] or raw
    ids = sorted(raw)
    for kind, by_id in (("T", fields["T"]), ("D", hyps)):
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise GenerateOutputError(f"{name}: no {kind}- line for sentence id(s) {missing[:10]}")
    first = lambda by_id, i: by_id[i][0]  # noqa: E731
    srcs = fields["S"]
    return Generated(
        ids=ids,
        hypotheses=[first(hyps, i) for i in ids],
        raw=[first(raw, i) for i in ids],
        references=[first(fields["T"], i) for i in ids],
        sources=[first(srcs, i) if i in srcs else "" for i in ids],
    )


def open_text(path: str) -> TextIO:
    """A text file opened for reading; ``PATH.gz`` is read when PATH itself is absent
    (kept outputs are stored gzipped). FileNotFoundError names PATH."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_generate_file(path: Optional[str]) -> Generated:
    """``read_generate_output`` of a file (or its ``.gz``; standard input for None or
    ``-``); GenerateOutputError naming a missing file."""
    if path in (None, "-"):
        return read_generate_output(sys.stdin, "<stdin>")
    try:
        with open_text(path) as f:
            return read_generate_output(f, path)
    except FileNotFoundError:
        raise GenerateOutputError(f"{path}: no such file") from None


def read_lines(path: str) -> List[str]:
    """Lines of a text file (or its ``.gz``) without newlines; ConfigError naming a
    missing file."""
    try:
        with open_text(path) as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None


def add_system_output_arguments(parser, hypotheses: str, references: str) -> None:
    """The scoring scripts' inputs: a fairseq-generate output file (positional; '-' or none: stdin),
    or ``--hyp`` and ``--ref`` files of ``hypotheses`` and ``references``, one sentence a line
    (``check_system_output_arguments`` after parsing)."""
    parser.add_argument("generate_output", nargs="?", default=None,
                        help="fairseq-generate output file ('-' or omitted: stdin); not with --hyp/--ref")
    parser.add_argument("--hyp", metavar="FILE", help=f"{hypotheses}, one sentence a line")
    parser.add_argument("--ref", metavar="FILE", help=f"{references}, one sentence a line")


def check_system_output_arguments(parser, args) -> None:
    """One argparse error (exit 2) for inputs given both ways, or --hyp without --ref."""
    if (args.hyp is None) != (args.ref is None):
        parser.error("--hyp and --ref go together")
    if args.hyp is not None and args.generate_output is not None:
        parser.error("give either generate output or --hyp/--ref, not both")
