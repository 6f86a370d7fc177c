#!/usr/bin/env python
"""Keep the small outputs of a recipe's work directory in the repository.

``keep_results.py WORK DEST`` copies, under the same relative paths, every score
file (``*.json``, e.g. scripts/score/score.py / score_tagging.py output and
compare_runs.py tables) and every ``*.md`` table of WORK into DEST, and of every
training log (``*.log`` beside a run) only the lines a table or a reader of the
protocol needs: fairseq's validation lines, the epoch ends and the final
"done training" line (a log with none of them is left out). Checkpoints,
binarized data and generated text stay behind, except the fairseq-generate outputs
named by ``--gen PATTERN`` (a file-name pattern, e.g. ``'test.beam*.gen'``): those
are kept as ``NAME.gz`` with only their T-, H- and D- lines (what scripts/score/score.py
and compare_runs.py read; both read ``NAME.gz`` where ``NAME`` is absent), so a paired
bootstrap against a control can be rerun from the kept files.

Why: a session's machine is not kept between sessions, and a protocol (tune, then
restarts, then the table; docs/*.md) can take longer than one session. The recipes
skip a run whose score file exists, so a later session resumes the protocol with

    mkdir -p WORK && cp -r DEST/. WORK/

and then the same recipe command. ``--dry-run`` lists what would be copied."""
import argparse
import fnmatch
import gzip
import os
import re
import shutil
import sys

LOG_LINES = re.compile(r"valid on '|\| valid \||end of epoch|done training in|early stop")
GEN_LINES = re.compile(r"[THD]-[0-9]+\t")
SKIP_DIRS = {"data", "cache", "bin"}


def kept(work, gen_patterns=()):
    """[(relative path, 'copy' | 'filter' | 'gen')] of WORK's files worth keeping."""
    out = []
    for root, dirs, files in os.walk(work):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), work)
            if name.endswith((".json", ".md")):
                out.append((rel, "copy"))
            elif name.endswith(".log") and not name.endswith(".gen.log"):
                out.append((rel, "filter"))
            elif any(fnmatch.fnmatch(name, pattern) for pattern in gen_patterns):
                out.append((rel, "gen"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", help="the recipe's work directory")
    p.add_argument("dest", help="where to keep its small outputs (e.g. examples/dss/results/ner)")
    p.add_argument("--gen", action="append", default=[], metavar="PATTERN",
                   help="also keep the fairseq-generate outputs whose file name matches PATTERN "
                        "(T-/H-/D- lines, gzipped; repeatable)")
    p.add_argument("--dry-run", action="store_true", help="list the files, copy nothing")
    args = p.parse_args(argv)
    if not os.path.isdir(args.work):
        p.error(f"work directory {args.work} not found")
    files = kept(args.work, args.gen)
    for rel, how in files:
        if args.dry_run:
            print(f"{how}\t{rel}")
            continue
        src, dst = os.path.join(args.work, rel), os.path.join(args.dest, rel)
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        if how == "copy":
            shutil.copyfile(src, dst)
            continue
        if how == "gen":
            with open(src, encoding="utf-8", errors="replace") as f:
                text = "".join(line for line in f if GEN_LINES.match(line))
            with open(dst + ".gz", "wb") as g:  # mtime 0: the same text gives the same bytes
                g.write(gzip.compress(text.encode("utf-8"), mtime=0))
            continue
        with open(src, errors="replace") as f:
            lines = [line for line in f if LOG_LINES.search(line)]
        if lines:  # a log without a validation line (a decode's, a data step's) is not worth keeping
            with open(dst, "w") as g:
                g.writelines(lines)
    print(f"{len(files)} files {'would be ' if args.dry_run else ''}looked at in {args.work}, kept in {args.dest}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
