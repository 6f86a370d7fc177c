"""A fork server for the commands the test suite launches.

Every ``fairseq-train`` / ``fairseq-generate`` / ``python script.py`` a test (or a
recipe a test runs) starts used to spend about 3 CPU seconds importing torch and
fairseq before doing a fraction of a second of work; the suite launches a few
hundred of them. Here one server process per test worker imports torch and
fairseq once; each command is then a ``fork()`` of it that takes the command's
argv, working directory, environment and stdin/stdout/stderr (passed over a Unix
socket) and runs the same entry point the console script would run.

The tests keep launching real commands (``subprocess.run(["fairseq-train", ...])``):
``install_shims`` writes small executables named ``fairseq-train``, ``python``, ...
into a directory that goes first on PATH. A shim sends its request to the server
and exits with the command's exit status (or dies of the same signal); SIGINT,
SIGTERM and SIGHUP sent to the shim are forwarded to the command, and a shim that
is killed (a test's timeout) takes its command down with it. Whenever the server
cannot run a command as a fresh interpreter would (no server, an environment
variable read at import time that differs, an interpreter flag), the shim execs
the real program instead, so a command's behaviour never depends on the server.

A child leaves with ``os._exit`` after the atexit functions: C++ static destructors
do not run, so a test of how a real process exits (an abort at interpreter shutdown)
must opt out (``FAIRSEQ_EXT_FORKSERVER=""`` in its environment).

Not preloaded: the plugin itself (``--user-dir fairseq_ext`` imports it in each
command, as in a fresh process) and the ``fairseq_cli`` modules (re-imported in
each command, so their module-level logging set-up runs as it would).

This module is imported by the shims with ``python -S``: standard library only at
module level.
"""
import array
import json
import os
import select
import signal
import socket
import sys

ENV_SOCKET = "FAIRSEQ_EXT_FORKSERVER"
CONSOLE = {
    "fairseq-train": "fairseq_cli.train",
    "fairseq-generate": "fairseq_cli.generate",
    "fairseq-preprocess": "fairseq_cli.preprocess",
    "fairseq-validate": "fairseq_cli.validate",
    "fairseq-eval-lm": "fairseq_cli.eval_lm",
    "fairseq-interactive": "fairseq_cli.interactive",
    "fairseq-score": "fairseq_cli.score",
}
SHIMS = list(CONSOLE) + ["python"]
# read by the interpreter or by torch / OpenMP when they are imported (in the server, once):
# a command whose value differs runs as a real process
# (PYTHON*: the interpreter's start-up: hash seed, buffering, warnings, ...; PYTHONPATH is applied per
# command instead; PYTHON is the recipes' own variable)
IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "GOMP_", "CUDA_", "TORCH_", "NCCL_", "LD_", "PYTHON", "LOGLEVEL",
               "MPLBACKEND")
MAX_MSG = 1 << 20


def _import_time_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in ("PYTHONPATH", "PYTHON")}


# ---------------------------------------------------------------------------- the shim (client)
def _real_program(name):
    return sys.executable if name == "python" else os.path.join(os.path.dirname(sys.executable), name)


def _exec_real(name, argv):
    path = _real_program(name)
    os.execv(path, [path] + argv)


def _request(name, argv):
    """argv as the server's child will run it: (kind, target, args, path0), or None."""
    if name in CONSOLE:
        return ["console", name, argv, os.path.dirname(_real_program(name))]
    if not argv:
        return None
    if argv[0] == "-m" and len(argv) > 1:
        return ["module", argv[1], argv[2:], os.getcwd()]
    if argv[0] == "-c" and len(argv) > 1:
        return ["code", argv[1], argv[2:], ""]
    if argv[0].startswith("-") or not argv[0].endswith(".py"):
        return None  # interpreter flags, stdin programs, ...: the real interpreter
    return ["script", argv[0], argv[1:], os.path.dirname(os.path.abspath(argv[0]))]


def shim_main(name):
    argv = sys.argv[1:]
    address = os.environ.get(ENV_SOCKET)
    request = _request(name, argv)
    if not address or request is None:
        _exec_real(name, argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(address)
        msg = json.dumps({"request": request, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        reply = json.loads(sock.recv(MAX_MSG) or b'{"fallback": "server closed"}')
    except OSError:
        reply = {"fallback": "no server"}
    if "fallback" in reply:
        sock.close()
        _exec_real(name, argv)
    pid = reply["pid"]

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    data = sock.recv(MAX_MSG)
    rc = json.loads(data)["rc"] if data else 1
    sys.stdout.flush()
    if rc < 0:  # died of a signal: so does the shim
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    os._exit(rc)


def install_shims(directory, tests_dir):
    """Write the shims into ``directory`` (put it first on PATH)."""
    os.makedirs(directory, exist_ok=True)
    for name in SHIMS:
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {tests_dir!r})\n"
                    f"import forkserver\nforkserver.shim_main({name!r})\n")
        os.chmod(path, 0o755)


# ---------------------------------------------------------------------------- the server
def _preload():
    import importlib

    import torch  # noqa: F401
    import fairseq  # noqa: F401
    for module in CONSOLE.values():  # their dependencies stay loaded; they are re-imported per command
        importlib.import_module(module)
    for name in [m for m in sys.modules if m == "fairseq_cli" or m.startswith("fairseq_cli.")]:
        del sys.modules[name]
    # torch._dynamo (with sympy): torch.optim.Optimizer imports it on first construction, 2-3 s of
    # every fairseq-train otherwise
    for module in ("sacrebleu", "numpy", "fairseq.models.transformer", "fairseq.models.lstm",
                   "fairseq.models.transformer_lm", "fairseq.tasks.translation", "fairseq.sequence_generator",
                   "torch._dynamo"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    _unique_save_dir_check()


def _unique_save_dir_check():
    """fairseq-train's start-up check that ``--save-dir`` (default ``checkpoints``, also
    under ``--no-save``) is writable creates and deletes ``SAVE_DIR/dummy``: the suite's
    commands that run at once from one working directory race on that one name, and the
    loser dies of ``FileNotFoundError``. Here the check writes a uniquely named temporary
    file instead: the same test of writability, the same warning and error when it fails."""
    import logging
    import tempfile

    from fairseq import checkpoint_utils

    def verify_checkpoint_directory(save_dir):
        os.makedirs(save_dir, exist_ok=True)
        try:
            with tempfile.NamedTemporaryFile(dir=save_dir, prefix="dummy."):
                pass
        except OSError:
            logging.getLogger("fairseq.checkpoint_utils").warning(
                "Unable to access checkpoint save directory: {}".format(save_dir))
            raise
    checkpoint_utils.verify_checkpoint_directory = verify_checkpoint_directory


def _fresh_logging():
    """The root logger as a fresh interpreter has it, and fairseq's own import-time
    ``logging.basicConfig(level=DEBUG)`` (fairseq/models/wav2vec/wav2vec2_classification.py)
    replayed where a fresh process would run it: when the command first imports fairseq
    (after the module-level ``basicConfig`` of fairseq-train, before the one generate
    calls later, both no-ops when the root has a handler already)."""
    import builtins
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    real_import = builtins.__import__

    def first_fairseq_import(name, globals=None, locals=None, fromlist=(), level=0):
        module = real_import(name, globals, locals, fromlist, level)
        if level == 0 and name.startswith("fairseq"):
            builtins.__import__ = real_import
            logging.basicConfig(level=logging.DEBUG)
        return module

    builtins.__import__ = first_fairseq_import


def _run_child(request, cwd, env, fds, base_path):
    """In the forked child: become the command, run it, exit as its interpreter would."""
    import atexit
    import importlib
    import runpy
    import threading

    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    kind, target, args, path0 = request
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [path0] + pythonpath + base_path
    _fresh_logging()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        if kind == "console":
            sys.argv = [os.path.join(path0, target)] + args
            importlib.import_module(CONSOLE[target]).cli_main()
        elif kind == "module":
            sys.argv = [target] + args
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c"] + args
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = [target] + args
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())
            code = 1
        except SystemExit as e:  # the plugin's hook ends a ConfigError with one line and SystemExit(2)
            code = e.code if isinstance(e.code, int) else 1
    # the interpreter's own shutdown: join non-daemon threads, then the atexit functions
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def serve(address, parent=None):
    """Serve on the Unix socket ``address`` until the process ``parent`` (default: the
    parent at start) is no longer this process's parent."""
    parent = os.getppid() if parent is None else parent
    base_env = _import_time_env(os.environ)
    before = dict(os.environ)
    _preload()
    # what the imports set in the environment (torch: KMP_*): a fresh process would have set them too
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    own_pythonpath = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in own_pythonpath]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(64)
    running = {}  # pid -> the shim's connection
    print(f"fork server {os.getpid()} ready on {address}", flush=True)
    while os.getppid() == parent:  # the test worker that started it is gone: so is the server
        readable, _, _ = select.select([listener] + list(running.values()), [], [], 0.02)
        for conn in readable:
            if conn is listener:
                _accept(listener, running, base_env, base_path, set_by_imports)
            else:  # the shim went away (killed): so does its command
                pid = next(p for p, c in running.items() if c is conn)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while running:
            try:
                pid, status, _ = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = running.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()


def _accept(listener, running, base_env, base_path, set_by_imports):
    conn, _ = listener.accept()
    fds = []
    try:
        msg, ancdata, _, _ = conn.recvmsg(MAX_MSG, socket.CMSG_SPACE(3 * array.array("i").itemsize))
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = list(array.array("i", data[: len(data) - len(data) % array.array("i").itemsize]))
        req = json.loads(msg)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    differs = sorted(set(_import_time_env(req["env"]).items()) ^ set(base_env.items()))
    if len(fds) != 3 or differs:
        reason = f"environment differs: {differs[:4]}" if differs else "no stdin/stdout/stderr"
        print(f"real process for {req['request'][:2]}: {reason}", flush=True)
        conn.send(json.dumps({"fallback": reason}).encode())
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        for other in running.values():
            other.close()
        _run_child(req["request"], req["cwd"], {**req["env"], **set_by_imports}, fds, base_path)
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({"pid": pid}).encode())
    running[pid] = conn


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
