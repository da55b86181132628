"""rltok.model is a leaf: the models import nothing from the layers built on them (generation,
the Hub, training, checkpoints, the command line), neither when loaded nor lazily inside a
function. model.generate / save_pretrained / from_pretrained come from rltok.model_methods."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

UPPER = ("rltok.generate", "rltok.hub", "rltok.train", "rltok.cli", "rltok.checkpoint")
MODEL_DIR = Path(importlib.util.find_spec("rltok.model").submodule_search_locations[0])
MODULES = ["rltok.model"] + [f"rltok.model.{m.name}" for m in pkgutil.iter_modules([str(MODEL_DIR)])]


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("module", MODULES)
def test_importing_a_model_module_loads_no_upper_layer(module):
    out = run_python(f"import sys, {module}\n"
                     f"print(' '.join(m for m in {UPPER!r} if m in sys.modules))")
    assert out.split() == [], f"importing {module} loaded {out.split()}"


def imported_names(path: Path) -> set[str]:
    """Every module an `import` anywhere in the file (module level or inside a function) names,
    relative imports resolved against rltok.model."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ["rltok", "model"][: max(0, 2 - node.level + 1)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # `from .. import hub`
    return names


@pytest.mark.parametrize("path", sorted(MODEL_DIR.glob("*.py")), ids=lambda p: p.name)
def test_model_source_names_no_upper_layer(path):
    bad = {n for n in imported_names(path) for up in UPPER if n == up or n.startswith(up + ".")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_package_exports_and_model_methods():
    # the top-level names load on first use; `rltok.train` / `rltok.evaluate` stay the functions
    # even when the submodules of the same name were imported first
    out = run_python(
        "import rltok.train, rltok.evaluate\n"
        "from rltok import train, evaluate, Trainer, load_checkpoint, from_pretrained, save_pretrained\n"
        "import rltok\n"
        "assert train is rltok.train and train.__module__ == 'rltok.train' and callable(train)\n"
        "assert evaluate is rltok.evaluate and evaluate.__module__ == 'rltok.evaluate'\n"
        "assert set(rltok.__all__) <= set(dir(rltok))\n"
        "from rltok.model import FlatByteLM, HourglassLM\n"
        "from rltok.model.token_lm import BPETokenLM\n"
        "for cls in (HourglassLM, FlatByteLM, BPETokenLM):\n"
        "    assert all(hasattr(cls, m) for m in ('save_pretrained', 'push_to_hub', 'from_pretrained'))\n"
        "assert hasattr(HourglassLM, 'generate') and hasattr(FlatByteLM, 'generate')\n"
        "print('ok')")
    assert out.strip() == "ok"
