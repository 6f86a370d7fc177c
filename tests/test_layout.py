"""The plugin's layout (README, "Layout"): imports go one way, from a layer to those below
it; no modules import each other in a circle; no two modules share a name; the data goes
one way, decode then score then the loss (the costs import nothing from decoding, and the
package decodes a batch through ``decoding.batch`` alone). Every import counts, also one
inside a function."""
import ast
import os
from typing import Dict, List, Set

from conftest import REPO

PACKAGE = os.path.join(REPO, "fairseq_ext")
# top to bottom; a package may import its own layer and those below it
LAYERS = [
    {"<commands>", "synthetic"},  # the package's __init__, options, finetune; the designed tasks register it all
    {"criterions"},
    {"tasks"},
    {"generators", "models"},
    {"costs"},
    {"decoding", "scoring"},
    {"evaluation"},
    {"runtime"},
    {"core"},
]


def _modules() -> Dict[str, str]:
    """{dotted module name: file} of every module of the package."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path[:-3], REPO).replace(os.sep, ".")
                out[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return out


def _imports(modules: Dict[str, str]) -> Dict[str, Set[str]]:
    """{module: the package's modules it imports} (``from a.b import c`` counts a.b, and a.b.c
    where that is a module)."""
    out = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            names: List[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found.update(n for n in names if n in modules and n != module)
        out[module] = found
    return out


def _layer(module: str) -> int:
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in set().union(*LAYERS)) else "<commands>"
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _arrows_up(imports: Dict[str, Set[str]]) -> List[str]:
    return [f"{a} -> {b}" for a, targets in imports.items() for b in sorted(targets)
            if b != "fairseq_ext" and _layer(b) < _layer(a)]


def _circles(imports: Dict[str, Set[str]]) -> List[str]:
    """Every circle a depth-first walk of the import graph closes (the package's own
    ``__init__``, which every submodule's import runs first, left out)."""
    graph = {a: {b for b in targets if b != "fairseq_ext"} for a, targets in imports.items()}
    circles, state = [], {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"
    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return circles


def test_imports_go_down_the_layers():
    modules = _modules()
    assert len(modules) > 60
    up = _arrows_up(_imports(modules))
    assert not up, "imports up a layer:\n" + "\n".join(up)


def test_no_modules_import_each_other_in_a_circle():
    circles = _circles(_imports(_modules()))
    assert not circles, "circles:\n" + "\n".join(circles)


def test_the_checks_see_an_arrow_up_and_a_circle():
    """The two checks on made-up graphs: the core importing a criterion goes up; the
    criterion importing the core goes down; two steps importing each other, or three in a
    ring, are circles."""
    assert _arrows_up({"fairseq_ext.core.risk": {"fairseq_ext.criterions.mrt"}}) == [
        "fairseq_ext.core.risk -> fairseq_ext.criterions.mrt"]
    assert _arrows_up({"fairseq_ext.criterions.mrt": {"fairseq_ext.core.risk", "fairseq_ext"}}) == []
    assert _arrows_up({"fairseq_ext.runtime.cli": {"fairseq_ext.options"}}) == [
        "fairseq_ext.runtime.cli -> fairseq_ext.options"]
    a, b, c = "fairseq_ext.decoding.a", "fairseq_ext.decoding.b", "fairseq_ext.decoding.c"
    assert _circles({a: {b}, b: {a}}) == [f"{a} -> {b} -> {a}"]
    assert _circles({a: {b}, b: {c}, c: {a}}) == [f"{a} -> {b} -> {c} -> {a}"]
    assert _circles({a: {b, c}, b: {c}, c: set()}) == []


def test_no_two_modules_share_a_name():
    names: Dict[str, List[str]] = {}
    for module, path in _modules().items():
        if os.path.basename(path) != "__init__.py":
            names.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    shared = {name: found for name, found in names.items() if len(found) > 1}
    assert not shared, shared


def _imported_names(path: str) -> Set[str]:
    """``module.name`` for every ``from module import name`` of a file."""
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_costs_import_nothing_from_decoding():
    """The costs score the candidates they are given; decoding is the caller's."""
    imports = _imports(_modules())
    found = [f"{a} -> {b}" for a, targets in imports.items() if a.startswith("fairseq_ext.costs")
             for b in sorted(targets) if b.startswith("fairseq_ext.decoding")]
    assert not found, found


DECODERS = {f"fairseq_ext.decoding.candidates.{name}" for name in
            ("decode_candidates", "decode_grouped", "decode_with_greedy", "prefix_sample")}


def test_the_package_decodes_a_batch_through_decoding_batch():
    """Criterions, generators and tasks call ``decoding.batch.decode_batch``; only the
    decoding layer reaches the functions behind it (a task rewrites its own batches with
    ``prefix_sample`` for fairseq-generate)."""
    allowed = {"fairseq_ext.decoding.batch", "fairseq_ext.tasks.text_completion"}
    found = [f"{module}: {sorted(_imported_names(path) & DECODERS)}" for module, path in _modules().items()
             if module not in allowed and _imported_names(path) & DECODERS]
    assert not found, found
    assert _imported_names(os.path.join(PACKAGE, "decoding", "batch.py")) >= DECODERS


# the search loops, one per search: greedy decoding / sampling, the soft and hard beam, DSS's exact pass
LOOPS = {"candidates.py": "_greedy_or_sample", "beam_search.py": "_run_beam", "dss_passes.py": "_sequential"}
# what names a decoding path: the choice, the step classes, fairseq's incremental machinery
PATH_WORDS = {"path", "static_cache", "decoder_step", "use_step", "FairseqStep", "TransformerStep", "LSTMStep",
              "incremental_state", "reorder_incremental_state_scripting", "reorder_encoder_out",
              "EmbeddingOverride", "SoftReorder"}


def _loop_words(path: str, function: str) -> Set[str]:
    """The names and attributes ``function`` of ``path`` uses in its body, the arguments of its
    ``build_step`` call left out (where the path is handed over)."""
    tree = ast.parse(open(path).read(), path)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "build_step"]
    assert len(calls) == 1, f"{function} asks build_step for its step once"
    skipped = {id(n) for call in calls for n in ast.walk(call)} | {id(n) for n in ast.walk(node.args)}
    words = set()
    for n in ast.walk(node):
        if id(n) in skipped:
            continue
        if isinstance(n, ast.Name):
            words.add(n.id)
        elif isinstance(n, ast.Attribute):
            words.add(n.attr)
        elif isinstance(n, ast.arg):
            words.add(n.arg)
    return words


def test_the_search_loops_do_not_name_the_decoding_path():
    """One loop per search serves both decoding paths: it gets its step from ``steps.build_step``
    and never names the path, a step class or fairseq's incremental machinery; the step objects
    are built in decoding/steps.py alone."""
    for name, function in LOOPS.items():
        named = _loop_words(os.path.join(PACKAGE, "decoding", name), function) & PATH_WORDS
        assert not named, f"{name}:{function} names {sorted(named)}"
    builders = {"fairseq_ext.decoding.steps.decoder_step", "fairseq_ext.decoding.fairseq_step.FairseqStep",
                "fairseq_ext.decoding.transformer_step.TransformerStep", "fairseq_ext.decoding.lstm_step.LSTMStep"}
    found = [module for module, path in _modules().items()
             if module != "fairseq_ext.decoding.steps" and _imported_names(path) & builders]
    assert not found, found


def test_the_loop_check_sees_a_path_named():
    """The check on a made-up loop that branches on the path."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write("def loop(model, path):\n    step = build_step(model, path)\n"
                "    if static_cache(model.decoder, path, 'x'):\n        pass\n")
    assert _loop_words(f.name, "loop") & PATH_WORDS == {"static_cache", "path"}  # path: in the if
    os.unlink(f.name)


def test_the_readme_layout_names_every_module_under_its_folder():
    """README, "Layout": every module of the package is named, under its folder's entry."""
    import re

    text = open(os.path.join(REPO, "README.md")).read()
    block = text[text.index("## Layout"):]
    block = block[:block.index("\n## ", 3)]
    lines = block.splitlines()
    folders = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^ {6}(\w+)/ ", line + " "))}
    missing = []
    for module, path in _modules().items():
        rel = os.path.relpath(path, PACKAGE)
        folder, name = os.path.split(rel)
        if name == "__init__.py" and folder:
            continue
        if not folder:
            found = any(line.strip().startswith(name) for line in lines)
        else:
            start = folders.get(folder)
            later = [i for i in folders.values() if start is not None and i > start]
            end = min(later) if later else len(lines)
            found = start is not None and any(re.search(rf"\b{re.escape(name)}\b", line) for line in lines[start:end])
        if not found:
            missing.append(rel)
    assert not missing, f"not in the README's Layout: {missing}"
