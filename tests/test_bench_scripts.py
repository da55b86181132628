"""The benchmarks are run by hand, not by the suite, so nothing else notices when the library
moves under them: every name they import from rltok (inside functions too) still exists, and the
optimiser benchmark still builds the scaling study's configs it times."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from conftest import corpus_folder

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _rltok_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rltok":
            yield from ((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names if a.name.split(".")[0] == "rltok")


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_every_name_a_benchmark_imports_from_rltok_exists(script):
    for module, name in _rltok_imports(BENCH / script):
        mod = importlib.import_module(module)
        assert name is None or hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), \
            f"{script} imports {name} from {module}, which has no such name"


def test_the_optimiser_benchmark_builds_the_studys_config_of_each_family(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_optimizer", BENCH / "bench_optimizer.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = corpus_folder(tmp_path)
    for family in bench.FAMILIES:
        cfg, n = bench.study_config(family, 0, str(tmp_path / family), str(data))
        assert n > 0 and cfg.train.threads == 1 and cfg.data.train == str(data)


def test_the_optimiser_trace_follows_each_kernel_step_by_step(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_optimizer", BENCH / "bench_optimizer.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ts, _ = bench.trainers("flat", 0, str(corpus_folder(tmp_path)), str(tmp_path))
    rows = bench.trace(ts, 3)
    names = {n for n, _ in ts["loop"].model.named_parameters()}
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        # foreach does the loop's arithmetic in the loop's order: the same weights and losses, bit for bit
        assert r["diff_foreach"] == 0.0 and r["loss_foreach"] == r["loss_loop"]
        assert 0.0 <= r["diff_fused"] < 1e-3 and r["where_fused"] in names
        assert abs(r["loss_fused"] - r["loss_loop"]) < 1e-3 and r["grad_norm_loop"] > 0
    assert all(t.step == 3 for t in ts.values())  # each step taken at its own learning rate, as fit() does
