"""Run many short console commands from one process (``conftest.run_cli_batch``).

    python tests/cli_batch.py REQUESTS.json RESULTS.json

REQUESTS: a list of ``{"argv": ["fairseq-train", ...], "cwd": DIR, "env": {...}}``.
The plugin (``--user-dir fairseq_ext``) is imported once, here; each command then
runs in a fork of this process exactly as the fork server runs a command
(``forkserver._run_child``: its argv, working directory, environment, stdout and
stderr, its exit status), one after the other. A command that only parses its
options costs a fork and a parse (tens of milliseconds) instead of a fresh import
of the plugin (about a second): the tests that go over every plugin option use it.
RESULTS: a list of ``{"rc", "stdout", "stderr", "seconds", "cpu"}`` (wall and CPU time),
in the order of REQUESTS.
"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import forkserver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(request, base_path, scratch):
    name, args = request["argv"][0], request["argv"][1:]
    env = {**os.environ, **request.get("env", {})}
    paths = [os.path.join(scratch, f) for f in ("stdout", "stderr")]
    fds = [os.open(os.devnull, os.O_RDONLY)] + [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for p in paths]
    bin_dir = os.path.dirname(forkserver._real_program(name))
    sys.stdout.flush()
    sys.stderr.flush()
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        forkserver._run_child(["console", name, args, bin_dir], request.get("cwd", REPO), env, fds, base_path)
        os._exit(1)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = {"seconds": round(time.perf_counter() - start, 3),
             "cpu": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3)}
    out, err = (open(p, encoding="utf-8", errors="replace").read() for p in paths)
    return {"rc": os.waitstatus_to_exitcode(status), "stdout": out, "stderr": err, **times}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("requests")
    p.add_argument("results")
    a = p.parse_args(argv)
    with open(a.requests) as f:
        requests = json.load(f)
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.join(REPO, "fairseq_ext")))
    pythonpath = {q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep) if q}
    base_path = [q for q in sys.path[1:] if q not in pythonpath]
    scratch = tempfile.mkdtemp(prefix="cli_batch")  # not TemporaryDirectory: a child's atexit would remove it
    try:
        results = [_run(r, base_path, scratch) for r in requests]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(a.results, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
