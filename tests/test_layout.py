"""The package layout: each subpackage imports on its own, lower layers never import upper
ones and no two modules import each other (not even from inside a function), functions fit
on a screen, and the decode loop never probes its drafter."""

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ["engine", "models", "bench", "training", "cli", "app"]
# What each layer must not pull in, directly or through what it imports.
FORBIDDEN = {
    "engine": ["gradio", "pandas", "plotly", "specdemo.models", "specdemo.app", "specdemo.bench", "specdemo.cli",
               "specdemo.training"],
    "models": ["gradio", "pandas", "plotly", "specdemo.app", "specdemo.bench", "specdemo.cli", "specdemo.training"],
    "bench": ["gradio", "specdemo.app", "specdemo.cli", "specdemo.training"],
    "training": ["gradio", "specdemo.app", "specdemo.bench", "specdemo.cli"],
    "cli": ["gradio", "specdemo.app", "specdemo.training"],
    "app": ["specdemo.cli", "specdemo.training"],
}


# Every layer imports torch and transformers' model classes, and they take most of an import's
# time, so one interpreter loads them once and forks a child per module to import: each child
# starts with no specdemo module loaded, as a fresh interpreter would, and the prelude is checked
# to load nothing any layer forbids, so whatever forbidden module a child holds, its import brought.
PRELUDE = ["torch", "transformers.modeling_utils", "transformers.models.llama.modeling_llama"]
_IMPORT_EACH_IN_A_FORK = """
import json, os, sys
prelude, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in prelude:
    __import__(name)
loaded = {"prelude": sorted(sys.modules)}
for module in modules:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            __import__(module)
            answer = sorted(sys.modules)
        except BaseException as error:
            answer = f"{type(error).__name__}: {error}"
        with os.fdopen(write, "w") as out:
            json.dump(answer, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        loaded[module] = json.load(answer)
    os.waitpid(child, 0)
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, list[str] | str]:
    """Module → every module loaded once it was imported in an interpreter that had loaded no
    specdemo module, or the error its import raised (the prelude's modules under "prelude")."""
    modules = ["specdemo", *(f"specdemo.{name}" for name in SUBPACKAGES)]
    out = subprocess.run([sys.executable, "-c", _IMPORT_EACH_IN_A_FORK, json.dumps(PRELUDE), json.dumps(modules)],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _loaded_after_import(imported_alone: dict[str, list[str] | str], module: str) -> set[str]:
    loaded = imported_alone[module]
    assert not isinstance(loaded, str), f"{module} does not import alone: {loaded}"
    return set(loaded)


def _forbidden_hits(loaded: set[str], forbidden: str) -> list[str]:
    return sorted(m for m in loaded if m == forbidden or m.startswith(forbidden + "."))


def test_the_shared_prelude_loads_nothing_a_layer_forbids(imported_alone):
    prelude = _loaded_after_import(imported_alone, "prelude")
    assert not [m for m in prelude if m == "specdemo" or m.startswith("specdemo.")]
    for forbidden in sorted({f for layer in FORBIDDEN.values() for f in layer}):
        assert not _forbidden_hits(prelude, forbidden), f"the prelude {PRELUDE} imports {forbidden}"


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_each_subpackage_imports_alone_and_only_from_below(name, imported_alone):
    loaded = _loaded_after_import(imported_alone, f"specdemo.{name}")
    for forbidden in FORBIDDEN[name]:
        hits = _forbidden_hits(loaded, forbidden)
        assert not hits, f"specdemo.{name} imports {hits}"


def test_the_top_level_api_needs_no_front_end(imported_alone):
    loaded = _loaded_after_import(imported_alone, "specdemo")
    assert not any(m.split(".")[0] in ("gradio", "plotly") for m in loaded)
    import specdemo

    for name in ("load_pair", "generate", "iter_generate", "ModelLoadError", "DecodeParams"):
        assert hasattr(specdemo, name)


def test_every_subpackage_says_what_it_owns_and_may_import():
    import importlib

    for name in SUBPACKAGES:
        doc = importlib.import_module(f"specdemo.{name}").__doc__ or ""
        assert "import" in doc.lower(), f"specdemo.{name} has no import rule in its docstring"


# --------------------------------------------------------------------------- imports between modules

PACKAGE = ROOT / "specdemo"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level or inside a function, except those under
    `if TYPE_CHECKING:` (never executed)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _runtime_imports(ast.Module([child], [])))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _runtime_imports(node)


def import_graph() -> dict[str, set[str]]:
    """specdemo module → the specdemo modules it imports, wherever the import statement sits."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in paths)
                continue
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in paths else source)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


@pytest.fixture(scope="module")
def package_imports() -> dict[str, set[str]]:
    return import_graph()


def test_the_import_graph_is_read_from_the_source(package_imports):
    graph = package_imports
    assert "specdemo.engine.decoding" in graph["specdemo.engine"]
    assert "specdemo.bench.measure.benchmark" in graph["specdemo.bench.measure.report"]


# The one module a layer may read from a layer it otherwise never imports: the benchmark's prompt
# suite is data, and training evaluates a head on its hand-written requests.
READS_ACROSS = {"training": ("specdemo.bench.suite",)}


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_no_module_reaches_a_forbidden_layer_not_even_inside_a_function(name, package_imports):
    layer = f"specdemo.{name}"
    forbidden = [f for f in FORBIDDEN[name] if f.startswith("specdemo.")]
    hits = [f"{module} → {target}" for module, targets in package_imports.items()
            if module == layer or module.startswith(layer + ".")
            for target in sorted(targets) if target not in READS_ACROSS.get(name, ())
            and any(target == f or target.startswith(f + ".") for f in forbidden)]
    assert not hits, "imports across layers: " + ", ".join(hits)


def test_no_two_modules_import_each_other_not_even_inside_a_function(package_imports):
    """A function-level import hides a cycle from the interpreter, not from the reader: each
    module depends on the other. Lower layers and helpers must not reach back up."""
    try:
        graphlib.TopologicalSorter(package_imports).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' → '.join(error.args[1])}")


# --------------------------------------------------------------------------- functions fit on a screen

MAX_FUNCTION_LINES = 60
SHORT_LAYERS = ("app", "engine", "bench", "models", "training")


@pytest.mark.parametrize("layer", SHORT_LAYERS)
def test_every_function_fits_on_a_screen(layer):
    long = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "longer than a screen: " + ", ".join(long)


def test_the_decode_loop_reads_what_is_declared_and_never_probes():
    """The loop reads the flags the `Drafter` base class declares, what a pair declares (`engine.pair.Pair`)
    and what a writer declares (`CachedLM.torch_threads`); it never asks whether anything has an attribute."""
    source = (PACKAGE / "engine" / "decoding.py").read_text(encoding="utf-8")
    calls = [ast.unparse(node) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")]
    assert not calls, calls


def test_the_layout_doc_names_every_module():
    """docs/layout.md names each module, by file name or, where it describes a folder's modules
    together (sweep/, gpu_suite/), by its stem."""
    doc = (ROOT / "docs" / "layout.md").read_text()
    words = set(doc.replace(",", " ").replace("(", " ").replace(")", " ").split())
    unnamed = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "specdemo").rglob("*.py"))
               if path.name != "__init__.py" and path.name not in doc and path.stem not in words]
    assert not unnamed, f"docs/layout.md does not name {unnamed}"


# --------------------------------------------------------------------------- private names stay home

def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_members(tree: ast.AST) -> set[str]:
    """The private methods and attributes a module's classes define (`def _x`, `self._x = …`, `_x = …`);
    `other._x = …` defines nothing, it reaches in."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_private(node.attr)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _is_private(node.id):
                names.add(node.id)
    return names


def private_reach_ins() -> list[str]:
    """Each use of another specdemo module's private name: `from m import _x`, `m._x` on an imported
    module, and `obj._x` where `_x` is a private member of a class another module defines (and no
    class of this module defines it); `self`, `cls` and `super()` reach only their own class."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in paths.items()}
    members = {name: _private_members(tree) for name, tree in trees.items()}
    hits = []
    for name, tree in sorted(trees.items()):
        package = name if paths[name].name == "__init__.py" else name.rpartition(".")[0]
        elsewhere = set().union(*(m for other, m in members.items() if other != name)) - members[name]
        bound: set[str] = set()  # names this module binds to specdemo modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                if source.split(".")[0] != "specdemo":
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in paths:
                        bound.add(alias.asname or alias.name)
                    if _is_private(alias.name):
                        hits.append(f"{name}:{node.lineno} from {source} import {alias.name}")
            elif isinstance(node, ast.Import):
                bound.update(alias.asname or alias.name for alias in node.names if alias.name in paths)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if (isinstance(owner, ast.Name) and owner.id in bound) or node.attr in elsewhere:
                hits.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    return hits


def test_the_walk_finds_a_reach_in(tmp_path, monkeypatch):
    """The walk over a two-module package of its own: each kind of reach-in is found, and a module's
    use of its own private names is not."""
    package = tmp_path / "specdemo"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def _helper():\n    pass\n\n\nclass A:\n    def _step(self):\n        return 1\n\n"
                                  "    def run(self, other):\n        return self._step() + other._step()\n")
    (package / "c.py").write_text("def reset(x):\n    x._step = None\n")
    (package / "b.py").write_text("from .a import _helper\nfrom . import a\n\n\ndef use(x):\n"
                                  "    return a._helper(), x._step()\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert private_reach_ins() == ["specdemo.b:1 from specdemo.a import _helper", "specdemo.b:6 a._helper",
                                   "specdemo.b:6 x._step", "specdemo.c:2 x._step"]


def test_no_module_uses_another_modules_private_name():
    """A name with a leading underscore is its module's own: a helper two modules share is public,
    under one name, where it belongs (the tree steppers live beside the drafters whose state they read)."""
    hits = private_reach_ins()
    assert not hits, "private names used across modules: " + ", ".join(hits)


# --------------------------------------------------------------------------- method names, declared once

# String constants equal to a registered method's name, outside the registry and the drafters: the count
# may fall, never rise (a method's facts belong to its entry; the rest of the product reads them there).
METHOD_NAME_LITERALS_AT_MOST = 2


def method_name_literals(package: Path = PACKAGE) -> dict[str, int]:
    from specdemo.engine.methods import METHODS

    counts = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "engine/methods.py" or relative.startswith("engine/drafters/"):
            continue
        found = sum(isinstance(node, ast.Constant) and node.value in METHODS
                    for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant))
        if found:
            counts[relative] = found
    return counts


def test_method_names_are_written_outside_the_registry_no_more_often_than_before():
    counts = method_name_literals()
    worst = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda item: -item[1])[:5])
    assert sum(counts.values()) <= METHOD_NAME_LITERALS_AT_MOST, f"method names written out: {worst}"


def test_the_literal_walk_counts_a_name_written_out(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "tool.py").write_text('METHOD = "sd"\nOTHER = "sd " + "x"\n')
    (tmp_path / "engine" / "methods.py").write_text('register("sd")\n')
    assert method_name_literals(tmp_path) == {"tool.py": 1}
