"""The package is layered: config at the bottom, then data -> model -> objective -> eval ->
training -> harness -> analysis -> cli. A module imports only modules of its own layer or the layers below it,
at module level or lazily inside a function, and no two modules import each other (directly or
around a longer loop). The core (everything below analysis) never imports rltok.analysis.
Modules directly in the package (rltok/version.py) are leaves below every layer: they import no
rltok module. Nothing inside the package imports the package root (`import rltok`,
`from rltok import X`): the root re-exports the layers, so that is an upward import too."""

from __future__ import annotations

import ast
import json
import re
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(importlib.util.find_spec("rltok").submodule_search_locations[0])
LAYERS = ["config", "data", "model", "objective", "eval", "training", "harness", "analysis", "cli"]


def typing_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` blocks: annotations only, never imported at run time."""
    return {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
            and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
            for stmt in block.body for n in ast.walk(stmt)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The rltok modules that a module's source imports anywhere (relative imports resolved)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = typing_only_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: never imported at run time
            continue
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            candidates = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for c in candidates:
            while c and c not in MODULES:
                c = c.rpartition(".")[0]
            if c and c != name and c != "rltok":
                found.add(c)
    return found


def root_imports(name: str) -> list[str]:
    """The statements of a module that import the package root itself: `import rltok` (bare) or
    `from rltok import X` / `from .. import X` where X is not a module (e.g. __version__)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    typing_only = typing_only_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "rltok"]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            if mod == "rltok":
                found += [f"from rltok import {a.name}" for a in node.names if f"rltok.{a.name}" not in MODULES]
    return found


LEAF = -1  # a module directly in the package, beside __init__: below every layer


def layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) < 2:
        return len(LAYERS)  # the package itself: glue above everything, checked separately
    if parts[1] not in LAYERS and not (SRC / parts[1]).is_dir():
        return LEAF
    return LAYERS.index(parts[1])


GRAPH = {name: imports_of(name) for name in MODULES}


@pytest.mark.parametrize("name", [n for n in MODULES if n != "rltok" and layer(n) != LEAF])
def test_module_imports_only_its_layer_and_below(name):
    above = sorted(m for m in GRAPH[name] if layer(m) > layer(name))
    assert not above, f"{name} (layer {LAYERS[layer(name)]}) imports upper-layer modules {above}"


def test_top_level_modules_are_leaves():
    leaves = [n for n in MODULES if layer(n) == LEAF]
    assert "rltok.version" in leaves
    assert not {n: sorted(GRAPH[n]) for n in leaves if GRAPH[n]}


@pytest.mark.parametrize("name", [n for n in MODULES if n != "rltok"])
def test_nothing_inside_the_package_imports_its_root(name):
    assert not root_imports(name), f"{name} imports the package root: {root_imports(name)}"


def test_root_imports_are_seen(tmp_path):
    """The check above reads these forms as imports of the root, and a submodule import as none."""
    sample = tmp_path / "sample.py"
    sample.write_text("import rltok\nfrom rltok import __version__\nfrom .. import Config\n"
                      "from rltok import config\nimport rltok.model\n")
    MODULES["rltok.training.sample"] = sample
    try:
        assert root_imports("rltok.training.sample") == ["import rltok", "from rltok import __version__",
                                                         "from rltok import Config"]
    finally:
        del MODULES["rltok.training.sample"]


def test_core_never_imports_analysis():
    core = [n for n in MODULES if n != "rltok" and layer(n) < LAYERS.index("analysis")]
    bad = {n: sorted(m for m in GRAPH[n] if m.startswith("rltok.analysis")) for n in core}
    assert not {n: m for n, m in bad.items() if m}


def test_no_import_cycles():
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if nxt == "rltok" or nxt.endswith(".__init__"):
                continue
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for name in sorted(MODULES):
        if name not in state and name != "rltok":
            visit(name, [])
    # a package's __init__ re-exporting its own modules is not a cycle worth failing on
    real = [c for c in cycles if not any(MODULES[m].name == "__init__.py" for m in c)]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


# One fresh interpreter answers every question below about what importing does (each used to
# start its own, and a start costs seconds): the third-party libraries are imported first, then
# the model alone (which upper layers did that load?), then every other rltok module with the calls
# that do work (processes, files, directory listings, the environment) replaced by ones that fail
# when rltok's own code makes them, directly or through the standard library. A library's own
# calls during its import (torch reading its files) are left alone. Last come the package's
# exports and the lab modules loaded by then. Its answers: one JSON line.
_FRESH_IMPORTS = r"""
import builtins, importlib, io, json, os, pathlib, subprocess, sys, sysconfig, traceback
SRC, NAMES = sys.argv[1], sys.argv[2:]
for lib in ("torch", "numpy", "safetensors.torch", "tokenizers", "tqdm", "rich", "zstandard", "huggingface_hub"):
    importlib.import_module(lib)
LIBS = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], "<frozen importlib")
seen = []

def from_rltok() -> bool:
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(SRC):
            return True
        if name.startswith(LIBS):  # a library doing its own work (its import included)
            return False
        f = f.f_back  # the standard library's wrappers: keep looking for who called them
    return False

def guard(owner, attr):
    real = getattr(owner, attr)
    def guarded(*a, **k):
        if from_rltok():
            seen.append(f"{getattr(owner, '__name__', owner)}.{attr}")
            raise RuntimeError(f"{attr} called while importing rltok")
        return real(*a, **k)
    setattr(owner, attr, guarded)

for owner, attrs in ((subprocess, ("Popen", "run", "call", "check_call", "check_output", "getoutput")),
                     (os, ("system", "popen", "listdir", "scandir", "walk", "getenv", "stat")),
                     (builtins, ("open",)), (io, ("open",)),
                     (pathlib.Path, ("read_text", "read_bytes", "open", "iterdir", "glob", "exists", "is_file"))):
    for attr in attrs:
        guard(owner, attr)
class Env(type(os.environ)):
    def __getitem__(self, key):
        if from_rltok():
            seen.append(f"os.environ[{key!r}]")
        return super().__getitem__(key)
os.environ.__class__ = Env
import torch
rng, threads, dtype = torch.get_rng_state(), torch.get_num_threads(), torch.get_default_dtype()
answers = {}

# the model alone, imported straight from its modules
import rltok.model, rltok.model.hourglass, rltok.model.flat, rltok.model.token_lm
answers["upper_layers_after_the_model"] = sorted(m for m in sys.modules if m.startswith(
    ("rltok.training", "rltok.eval", "rltok.analysis", "rltok.cli", "rltok.objective")))
from rltok.model.hourglass import HourglassLM
from rltok.model.token_lm import BPETokenLM
answers["model_methods"] = [hasattr(HourglassLM, "generate"), hasattr(BPETokenLM, "from_pretrained")]

# then every module
for name in NAMES:
    importlib.import_module(name)
assert torch.equal(rng, torch.get_rng_state()), "the torch RNG was drawn from at import"
assert (threads, dtype) == (torch.get_num_threads(), torch.get_default_dtype()), "torch settings changed at import"
answers["seen"] = sorted(set(seen))
answers["lab_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "rltok_lab")

# the package root's exports
try:
    from rltok import train, evaluate, Trainer, load_checkpoint, from_pretrained, save_pretrained
    import rltok
    assert callable(train) and train.__module__ == "rltok.training.trainer"
    assert callable(evaluate) and evaluate.__module__ == "rltok.eval.evaluate"
    assert set(rltok.__all__) <= set(dir(rltok))
    from rltok.model import FlatByteLM
    for cls in (HourglassLM, FlatByteLM, BPETokenLM):
        assert all(hasattr(cls, m) for m in ("save_pretrained", "push_to_hub", "from_pretrained")), cls
    assert hasattr(HourglassLM, "generate") and hasattr(FlatByteLM, "generate")
    assert HourglassLM.save_pretrained.__module__ == "rltok.model.pretrained"
    assert HourglassLM.generate.__module__ == "rltok.model.generate"
    assert not hasattr(BPETokenLM, "start_decoding")  # it predicts tokens: generate refuses it
    assert rltok.HourglassLM is HourglassLM
    answers["exports"] = "ok"
except Exception:
    answers["exports"] = traceback.format_exc()
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def fresh_imports() -> dict:
    names = [n for n in MODULES if not n.endswith("__main__")]
    done = subprocess.run([sys.executable, "-c", _FRESH_IMPORTS, str(SRC), *names],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_model_loads_no_upper_layer(fresh_imports):
    assert fresh_imports["upper_layers_after_the_model"] == []


def test_model_methods_exist_when_the_model_is_imported(fresh_imports):
    """generate and the model folder's methods are the classes' own, there without importing
    anything above the model."""
    assert fresh_imports["model_methods"] == [True, True]


def test_package_exports_and_model_methods(fresh_imports):
    assert fresh_imports["exports"] == "ok"


def test_importing_any_module_runs_nothing(fresh_imports):
    """No module of the package does work when it is imported: no git or other process, no file
    or environment read, no torch draw or setting (the command-line entry `__main__` aside)."""
    assert fresh_imports["seen"] == []


def test_the_library_never_imports_the_lab():
    """The lab (lab/rltok_lab: the studies' instruments and steps) depends on rltok one way: no
    module of the package names it, at run time or in a string it imports from later."""
    bad = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "rltok_lab" for a in node.names):
                bad.append(name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rltok_lab":
                bad.append(name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"rltok_lab(\.\w+)*:\w+", node.value):  # a registry target "rltok_lab.x:Y"
                bad.append(name)
    assert not bad, f"the library imports the lab: {sorted(set(bad))}"


def test_importing_every_library_module_loads_no_lab_module(fresh_imports):
    assert fresh_imports["lab_modules"] == []
