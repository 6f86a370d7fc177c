"""Which torch and fairseq the plugin runs with, checked when it is imported.

The package does not name torch or fairseq as requirements: installed into an
environment that already has them (a CUDA build of torch; fairseq 0.12.2 from the
package index, ``fairseq-fixed``, a source checkout, a compatible fork), pip
installs nothing over them. Instead, importing the plugin checks the versions it
finds and, outside the supported ranges, ends with one line naming them:

    fairseq-train: error: fairseq-ext needs fairseq >= 0.12.2, < 0.13 (found fairseq 0.10.2 in ...); ...

The ranges: fairseq 0.12.2 up to, not including, 0.13 (0.12.2 itself on Python
< 3.11, ``fairseq-fixed`` 0.12.3.1 on 3.11 and later, forks that keep the 0.12
API); torch 2.0 up to, not including, 3 (the plugin's tests run on torch 2.13,
its GPU benchmarks on torch 2.11).
"""
import os
import re
import sys
from typing import Optional, Tuple

FAIRSEQ_RANGE = ((0, 12, 2), (0, 13))
TORCH_RANGE = ((2, 0), (3,))
INSTALL_HINT = ("in an empty environment `make install` from the source tree installs a working set; see the "
                "README's set-up sections")


class UnsupportedEnvironment(ImportError):
    """torch or fairseq is missing or outside the supported range; the message is one line."""


def release(version: str) -> Tuple[int, ...]:
    """The numeric release of a version string: "2.13.0+cu130" -> (2, 13, 0), "0.12.3.1" ->
    (0, 12, 3, 1), "1.0.0a0" -> (1, 0, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(p) for p in match.group(0).split("."))


def _spell(bounds: Tuple[Tuple[int, ...], Tuple[int, ...]]) -> str:
    low, high = (".".join(map(str, b)) for b in bounds)
    return f">= {low}, < {high}"


def _refusal(name: str, version: Optional[str], where: str, bounds) -> Optional[str]:
    if version is None:
        return f"fairseq-ext needs {name} {_spell(bounds)}, and {name} is not installed"
    found = release(version)
    if not bounds[0] <= found < bounds[1]:
        return f"fairseq-ext needs {name} {_spell(bounds)} (found {name} {version} in {where})"
    return None


def _installed(module: str) -> Tuple[Optional[str], str]:
    """(the version of an importable module, or None when it is missing; its directory), read
    as the module itself reads it (``MODULE/version.py``, or fairseq's ``version.txt`` in a
    source checkout), without importing it: whatever distribution installed it."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None:
        return None, ""
    where = os.path.dirname(spec.origin) if spec.origin else next(iter(spec.submodule_search_locations or []), "")
    version_py, version_txt = os.path.join(where, "version.py"), os.path.join(where, "version.txt")
    if os.path.isfile(version_py):
        with open(version_py, encoding="utf-8") as f:
            match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", f.read(), re.M)
        if match:
            return match.group(1), where
    if os.path.isfile(version_txt):
        with open(version_txt, encoding="utf-8") as f:
            return f.read().strip(), where
    return "unknown", where


def check() -> None:
    """Raise ``UnsupportedEnvironment`` (one line) if torch or fairseq is missing or unsupported."""
    problems = []
    for name, bounds in (("torch", TORCH_RANGE), ("fairseq", FAIRSEQ_RANGE)):
        version, where = _installed(name)
        try:
            problem = _refusal(name, version, where, bounds)
        except ValueError:
            problem = f"fairseq-ext needs {name} {_spell(bounds)} (found {name} of unknown version in {where})"
        if problem:
            problems.append(problem)
    if problems:
        raise UnsupportedEnvironment("; ".join(problems) + f"; {INSTALL_HINT}")


def check_or_exit() -> None:
    """``check``; a failure ends the process with the one line and exit status 2 (a console
    command such as ``fairseq-train``, a script), or raises in an interactive session (or with
    ``FAIRSEQ_EXT_TRACEBACK=1``)."""
    try:
        check()
    except UnsupportedEnvironment as e:
        interactive = sys.flags.interactive or hasattr(sys, "ps1") or "IPython" in sys.modules
        if interactive or os.environ.get("FAIRSEQ_EXT_TRACEBACK"):
            raise
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        prog = prog if prog and not prog.startswith("-") else "python"  # python -c / -m while importing
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(2)

