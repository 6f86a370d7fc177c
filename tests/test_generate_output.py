"""The one reader of fairseq-generate output (fairseq_ext/evaluation/generate_output.py),
on hand-written outputs, and the comparison helpers on hand-computed values (Welch and the incomplete beta:
tests/test_score_script.py)."""
import gzip
import re

import numpy as np
import pytest

from fairseq_ext.evaluation import comparison
from fairseq_ext.evaluation.generate_output import (
    GenerateOutputError,
    parse,
    read_generate_file,
    read_generate_output,
    read_lines,
)

# two sentences out of id order, an n-best list for id 1, log lines between them
OUTPUT = """2026-01-01 | INFO | fairseq_cli.generate | loading
S-1\tx1 x2
T-1\ty1 y3
H-1\t-0.1\ty1 y3
D-1\t-0.1\tY1 Y3
P-1\t-0.05 -0.05
H-1\t-0.7\ty1 y1
D-1\t-0.7\tY1 Y1
T-0\ty2
H-0\t-0.2\ty0
D-0\t-0.2\tY0
Generate test with beam=2: BLEU4 = 0.00
"""


def test_sorted_by_id_first_hypothesis_detokenized_text_preferred():
    g = read_generate_output(OUTPUT)
    assert g.ids == [0, 1]
    assert g.hypotheses == ["Y0", "Y1 Y3"]  # D- text, first of the n-best
    assert g.raw == ["y0", "y1 y3"]  # H- text
    assert g.references == ["y2", "y1 y3"]
    assert g.sources == ["", "x1 x2"]  # id 0 has no S- line


def test_h_text_without_d_lines_and_parse_keeps_every_line():
    no_d = "".join(line + "\n" for line in OUTPUT.splitlines() if not line.startswith("D-"))
    assert read_generate_output(no_d).hypotheses == ["y0", "y1 y3"]
    fields = parse(OUTPUT)
    assert fields["H"][1] == ["y1 y3", "y1 y1"] and fields["P"][1] == ["-0.05 -0.05"]
    assert parse(OUTPUT, keep_scores=True)["H"][1] == ["-0.1\ty1 y3", "-0.7\ty1 y1"]


@pytest.mark.parametrize("text, message", [
    ("T-0\ty2\n", "no H- lines"),
    ("H-0\t-0.2\ty0\n", "no T- line for sentence id(s) [0]"),
    ("T-0\ty\nT-1\ty\nH-0\t-1\ty\nH-1\t-1\ty\nD-0\t-1\ty\n", "no D- line for sentence id(s) [1]"),
])
def test_incomplete_output_is_refused_naming_the_file(text, message):
    with pytest.raises(GenerateOutputError, match="^" + re.escape("run.gen: " + message)):
        read_generate_output(text, "run.gen")


def test_files_gzipped_files_and_missing_files(tmp_path):
    with gzip.open(tmp_path / "kept.gen.gz", "wt") as f:
        f.write(OUTPUT)
    assert read_generate_file(str(tmp_path / "kept.gen")).hypotheses == ["Y0", "Y1 Y3"]
    (tmp_path / "lines.txt").write_text("a b\nc\n")
    assert read_lines(str(tmp_path / "lines.txt")) == ["a b", "c"]
    with pytest.raises(GenerateOutputError, match="absent.gen: no such file"):
        read_generate_file(str(tmp_path / "absent.gen"))


def test_mean_std_and_table_formats():
    assert comparison.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert comparison.format_mean_std([0.5, 0.7], digits=1, scale=100) == "60.0 +- 14.1"
    assert comparison.format_mean_std([0.5]) == "0.50" and comparison.format_mean_std([]) == "n/a"
    assert comparison.format_table([["system", "BLEU"], ["ce", "37.64"], ["dss", "8.9"]]) == (
        "system   BLEU\n------  -----\nce      37.64\ndss       8.9")
    assert comparison.format_table([["a", "b"], ["1", "2"]], markdown=True) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_paired_bootstrap_mean_limits():
    base = np.zeros(50)
    assert comparison.paired_bootstrap_mean(base, base, 200, 0) == 1.0  # identical systems
    better = np.ones(50)  # every sentence 1 better: no resample reaches the null
    assert comparison.paired_bootstrap_mean(better, base, 200, 0) == pytest.approx(1 / 201)
