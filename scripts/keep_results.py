#!/usr/bin/env python
"""Keep the small outputs of a recipe's work directory in the repository.

``keep_results.py WORK DEST`` copies, under the same relative paths, every score
file (``*.json``, e.g. scripts/score.py / score_tagging.py output and
compare_runs.py tables) and every ``*.md`` table of WORK into DEST, and of every
training log (``*.log`` beside a run) only the lines a table or a reader of the
protocol needs: fairseq's validation lines, the epoch ends and the final
"done training" line (a log with none of them is left out). Checkpoints,
binarized data and generated text stay behind.

Why: a session's machine is not kept between sessions, and a protocol (tune, then
restarts, then the table; docs/*.md) can take longer than one session. The recipes
skip a run whose score file exists, so a later session resumes the protocol with

    mkdir -p WORK && cp -r DEST/. WORK/

and then the same recipe command. ``--dry-run`` lists what would be copied."""
import argparse
import os
import re
import shutil
import sys

LOG_LINES = re.compile(r"valid on '|\| valid \||end of epoch|done training in|early stop")
SKIP_DIRS = {"data", "cache", "bin"}


def kept(work):
    """[(relative path, 'copy' | 'filter')] of WORK's files worth keeping."""
    out = []
    for root, dirs, files in os.walk(work):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), work)
            if name.endswith((".json", ".md")):
                out.append((rel, "copy"))
            elif name.endswith(".log") and not name.endswith(".gen.log"):
                out.append((rel, "filter"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", help="the recipe's work directory")
    p.add_argument("dest", help="where to keep its small outputs (e.g. results/dss_ner)")
    p.add_argument("--dry-run", action="store_true", help="list the files, copy nothing")
    args = p.parse_args(argv)
    if not os.path.isdir(args.work):
        p.error(f"work directory {args.work} not found")
    files = kept(args.work)
    for rel, how in files:
        if args.dry_run:
            print(f"{how}\t{rel}")
            continue
        src, dst = os.path.join(args.work, rel), os.path.join(args.dest, rel)
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        if how == "copy":
            shutil.copyfile(src, dst)
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
