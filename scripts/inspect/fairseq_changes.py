"""Which fairseq attributes loading the plugin replaces: fairseq's modules (those its
console commands import) and the classes they define are walked before and after
``import fairseq_ext``, and every attribute whose object changed is printed, one dotted
name a line. ``--activate`` also applies what a command that chooses a plugin component
gets (``fairseq_ext.runtime.fixes.activate``) and prints those separately. A changed
``sys.excepthook`` is printed as ``sys.excepthook``.

docs/fairseq.md lists the same names; tests/test_fairseq_guest.py compares the two.

usage: python scripts/inspect/fairseq_changes.py [--activate] [--json]
"""
import argparse
import importlib
import inspect
import json
import os
import sys
from typing import Dict, List, Tuple

# the modules fairseq's console commands import, and with them most of fairseq
ENTRY_MODULES = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.validate", "fairseq_cli.interactive",
                 "fairseq_cli.eval_lm", "fairseq.checkpoint_utils", "fairseq.trainer", "fairseq.options",
                 "fairseq.distributed.utils", "fairseq.optim.amp_optimizer", "fairseq.hub_utils")


def snapshot() -> Dict[str, Tuple[int, object]]:
    """{dotted name: (id, object)} of every attribute of every loaded fairseq module and of
    every class such a module defines (the object is kept so that ids stay unique)."""
    out, seen = {}, set()
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == "fairseq" or name.startswith(("fairseq.", "fairseq_cli"))):
            continue
        if id(module) in seen:  # one module under two names (fairseq.distributed_utils)
            continue
        seen.add(id(module))
        for attr, value in list(vars(module).items()):
            out[f"{name}.{attr}"] = (id(value), value)
            if inspect.isclass(value) and value.__module__ == name:
                for cattr, cvalue in list(vars(value).items()):
                    out[f"{name}.{attr}.{cattr}"] = (id(cvalue), cvalue)
    out["sys.excepthook"] = (id(sys.excepthook), sys.excepthook)
    return out


def changed(before: Dict[str, Tuple[int, object]], after: Dict[str, Tuple[int, object]]) -> List[str]:
    """The names whose object differs (or that are gone) after, sorted."""
    return sorted(name for name, (ident, _) in before.items() if name not in after or after[name][0] != ident)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--activate", action="store_true", help="also list what fairseq_ext.runtime.fixes.activate() changes")
    p.add_argument("--json", action="store_true", help="print {on_import: [...], on_activate: [...]} as JSON")
    a = p.parse_args()
    os.environ.pop("FAIRSEQ_EXT_FIXES", None)
    for name in ENTRY_MODULES:
        importlib.import_module(name)
    before = snapshot()
    import fairseq_ext  # noqa: F401

    on_import = changed(before, snapshot())
    result = {"on_import": on_import}
    if a.activate:
        middle = snapshot()
        from fairseq_ext.runtime import fixes

        fixes.activate(command_line=True)
        result["on_activate"] = changed(middle, snapshot())
    if a.json:
        print(json.dumps(result, indent=1))
        return
    for key, names in result.items():
        print(f"# {key.replace('_', ' ')}: {len(names)}")
        print("\n".join(names))


if __name__ == "__main__":
    main()
