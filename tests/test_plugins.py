"""Components from outside the package, usable from every command: the example plugin of
docs/EXTENDING.md (read out of the doc, so it cannot rot) is installed as a package with an entry
point in the group rltok.plugins, and given as a file to --plugin and to the config key
`plugins`; `rltok` runs as a subprocess on it (train, compare, eval, segment, generate, export).
A run records the plugins it needs; loading it without them is one error line naming them, and
a folder that names a plugin never runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run_cli
from rltok.config import CHUNKERS, ESTIMATORS, FAMILIES, RATES, REWARDS, ConfigError, load_config
from rltok.config import plugins as plugin_state

DOC = Path(__file__).resolve().parents[1] / "docs" / "EXTENDING.md"
SRC = Path(importlib.util.find_spec("rltok").submodule_search_locations[0]).parent  # the rltok under test
FAST = ["--preset", "test", "train.device=cpu", "train.threads=1", "train.eval_batches=1", "train.log_every=1"]
PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "rltok-toy-rules"
version = "0.1.0"

[project.entry-points."rltok.plugins"]
toy_rules = "toy_rules"

[tool.setuptools]
packages = ["toy_rules"]
"""


def example_code() -> str:
    """The plugin module of docs/EXTENDING.md's complete example."""
    found = re.search(r"<!-- the plugin example[^>]*-->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert found, "docs/EXTENDING.md lost its plugin example block"
    return found.group(1)


def rltok(*argv, site: Path | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`rltok ARGV` in a fresh process, the installed plugins under `site` on its path."""
    paths = [str(SRC), *([str(site)] if site else []), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", "rltok.cli", *map(str, argv)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def one_error_line(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def text_folder(folder: Path) -> Path:
    """A small corpus with train/val/test files: lines of words, so a newline rule has work."""
    folder.mkdir(parents=True)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for name, n in (("train.txt", 2000), ("val.txt", 200), ("test.txt", 200)):
        lines = (" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(1 + i % 6)) for i in range(n))
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example installed the documented way (an entry point, pip), and one run trained with
    its boundary rule by name alone: the installed plugin loads by itself."""
    tmp = tmp_path_factory.mktemp("plugins")
    pkg = tmp / "pkg"
    (pkg / "toy_rules").mkdir(parents=True)
    (pkg / "toy_rules" / "__init__.py").write_text(example_code())
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    site = tmp / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(pkg)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    data = text_folder(tmp / "data")
    run = tmp / "run"
    ok(rltok("train", *FAST, "model.chunker=after", "--steps", "3", "--data", data, "--out", run, site=site))
    return SimpleNamespace(tmp=tmp, site=site, data=data, run=run)


def test_an_installed_plugin_works_in_every_command(installed):
    tmp, site, run = installed.tmp, installed.site, installed.run
    saved = json.loads((run / "config.json").read_text())
    assert saved["plugins"] == ["toy_rules"]
    assert saved["plugin_sources"] == {"toy_rules": {"provides": ["model.chunker=after"],
                                                     "distribution": "rltok-toy-rules"}}
    seg = ok(rltok("segment", "-c", run, "--color", "never", "one two\nthree\nfour", site=site)).stdout
    assert seg.splitlines()[1:3] == ["|three", "|four"]  # a chunk ends after each newline: the plugin's rule
    assert ok(rltok("generate", "-c", run, "ab", "-n", "8", "--seed", "1", site=site)).stdout
    ok(rltok("export", "-c", run, "--out", tmp / "exported", site=site))
    exported = json.loads((tmp / "exported" / "config.json").read_text())
    assert exported["plugins"] == ["toy_rules"] and "rltok-toy-rules" in (tmp / "exported" / "README.md").read_text()
    assert json.loads(ok(rltok("eval", "-c", tmp / "exported", "--max-windows", "2", site=site)).stdout)["bpb"] > 0
    # compare: a registered rule is a method by its name, beside a named one
    ok(rltok("compare", "--data", installed.data, "--methods", "after", "uniform", "--budget-bytes", "3000",
             "--preset", "test", "--max-eval-windows", "2", "--out", tmp / "cmp", "train.threads=1",
             "train.device=cpu", site=site))
    rows = json.loads((tmp / "cmp" / "summary.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"after", "uniform"}
    # not installed: one line naming the plugin, its distribution and the kind unknown without it
    one_error_line(rltok("eval", "-c", run), "'toy_rules'", "rltok-toy-rules", "model.chunker kind 'after'")


def test_a_plugin_file_from_the_config_key_and_the_flag(installed, tmp_path):
    plugin = tmp_path / "rules" / "toy_rules_file.py"
    plugin.parent.mkdir()
    plugin.write_text(example_code())
    # the config key, in a file, relative to it; the rl rule trained with the plugin's reward and rate control
    (plugin.parent / "run.toml").write_text('plugins = ["toy_rules_file.py"]\n\n[objective]\nreward = "early_gain"\n'
                                            'rate = {kind = "squared", weight = 0.5}\n')
    run = tmp_path / "run"
    ok(rltok("train", *FAST, "--config", plugin.parent / "run.toml", "--steps", "2", "--data", installed.data,
             "--out", run, cwd=tmp_path))
    saved = json.loads((run / "config.json").read_text())
    assert saved["plugins"] == [str(plugin)] and saved["objective"]["rate"] == {
        "kind": "squared", "compute_price": 0.0, "cost_estimator": "exact", "weight": 0.5}
    assert saved["plugin_sources"][str(plugin)]["provides"] == ["objective.reward=early_gain", "objective.rate=squared"]
    assert all("rate_miss" in json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
               if '"loss"' in line)  # the plugin's rate control ran in every step
    # --plugin, from another folder: the run names the file by its absolute path
    assert json.loads(ok(rltok("eval", "--plugin", plugin, "-c", run, "--max-windows", "2")).stdout)["bpb"] > 0
    one_error_line(rltok("eval", "-c", run), str(plugin), "objective.reward kind 'early_gain'",
                   f"--plugin {plugin}")
    one_error_line(rltok("train", "--resume", "--out", run, "--steps", "3"), f"the run in {run}", str(plugin))
    resumed = ok(rltok("train", "--plugin", plugin, "--resume", "--out", run, "--steps", "3"))
    assert json.loads(resumed.stdout.splitlines()[-1])["step"] == 3


@pytest.fixture
def registries_restored():
    """In-process plugins register into the process's registries: put them back afterwards."""
    registries = (CHUNKERS, FAMILIES, RATES, REWARDS, ESTIMATORS)
    saved = [dict(r.entries) for r in registries]
    loaded = dict(plugin_state._loaded)
    yield
    for registry, entries in zip(registries, saved):
        registry.entries = entries
    plugin_state._loaded.clear()
    plugin_state._loaded.update(loaded)


def test_a_plugin_that_fails_is_one_error_line(tmp_path, capsys, registries_restored):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    code, _, err = run_cli(capsys, "eval", "--plugin", broken, "-c", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "broken.py" in err and "no GPU here" in err, err
    (tmp_path / "syntax.py").write_text("def f(:\n")
    code, _, err = run_cli(capsys, "train", "--plugin", tmp_path / "syntax.py", "--print-config")
    assert code == 2 and err.count("\n") == 1 and "SyntaxError" in err, err
    for spec, said in (("no_such_plugin_module", "no module named 'no_such_plugin_module'"),
                       (str(tmp_path / "missing.py"), "plugin file not found"), ("not a module!", "neither")):
        code, _, err = run_cli(capsys, "segment", "--plugin", spec, "text")
        assert code == 2 and err.count("\n") == 1 and said in err, err
    code, _, err = run_cli(capsys, "train", "--print-config", "plugins=no_such_plugin_module")
    assert code == 2 and "no_such_plugin_module" in err and err.count("\n") == 1, err
    code, _, err = run_cli(capsys, "lm-eval", "--plugin", "no_such_plugin_module", "--tasks", "x")
    assert code == 2 and "no_such_plugin_module" in err and err.count("\n") == 1, err


def test_the_plugins_key_on_the_command_line(tmp_path, registries_restored):
    plugin = tmp_path / "toy_rules_key.py"
    plugin.write_text(example_code())
    cfg = load_config("test", overrides=["model.chunker.after=;", "model.chunker=after", f"plugins={plugin}"])
    assert cfg.plugins == (str(plugin),) and cfg.model.chunker.after == ";"
    from rltok.analysis.compare import method_overrides

    assert method_overrides("after@model.chunker.after=;") == ["model.chunker=after", "model.chunker.after=;"]
    assert method_overrides("flat") == ["model.arch=flat"]  # the named methods first, unchanged
    with pytest.raises(ValueError, match="boundary rule or model family registered"):
        method_overrides("no_such_method")
    with pytest.raises(ConfigError, match="did you mean 'after'"):
        load_config("test", overrides=["model.chunker=aftr"])


def test_a_folder_naming_a_plugin_runs_none_of_it(tmp_path, capsys):
    """A model folder from elsewhere whose config.json names a plugin file: nothing is imported,
    and loading it is one line naming the plugin and the unknown kind."""
    from conftest import tiny_model_config
    from rltok.model.factory import build_model
    from rltok.model.pretrained import save_pretrained
    from rltok.training.checkpoint import CheckpointError
    from rltok.training.loading import load

    folder = save_pretrained(build_model(tiny_model_config(chunker="whitespace")), tmp_path / "model")
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["model"]["chunker"] = {"kind": "evil_rule"}
    config["plugins"] = [str(evil)]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"needs the plugin .*evil\.py.* model\.chunker kind 'evil_rule'"):
        load(folder)
    code, _, err = run_cli(capsys, "generate", "-c", folder, "hi", "-n", "2")
    assert code == 2 and err.count("\n") == 1 and "evil.py" in err, err
    assert not marker.exists()


def test_a_model_family_from_outside_loads_as_its_own_class(tmp_path, registries_restored):
    from conftest import tiny_model_config
    from rltok.model.factory import build_model
    from rltok.model.flat import FlatByteLM
    from rltok.model.pretrained import PretrainedError
    from rltok.training.loading import from_pretrained

    class ToyFlat(FlatByteLM):
        arch = "toy_flat"

    FAMILIES.register("toy_flat", ToyFlat)
    model = build_model(tiny_model_config(arch="toy_flat", flat_layers=1))
    folder = model.save_pretrained(tmp_path / "toy")
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "ToyFlat" and config["plugins"] == [__name__]
    assert type(from_pretrained(folder)) is ToyFlat
    with pytest.raises(PretrainedError, match="holds a ToyFlat"):
        FlatByteLM.from_pretrained(folder)


def test_a_family_on_the_bare_mixin_answers_what_data_parallel_training_asks():
    import torch

    from conftest import tiny_model_config
    from rltok.model.pretrained import PretrainedMixin

    class Bare(torch.nn.Module, PretrainedMixin):  # what EXTENDING lists, nothing of rltok's models
        arch = "bare"

    assert Bare.fitted_to_data(tiny_model_config()) is False  # under torchrun every rank builds its own


def test_estimator_settings_are_read_from_whatever_kind_has_them(registries_restored):
    from dataclasses import dataclass

    from rltok.config import ObjectiveConfig, Section
    from rltok.objective.build import estimator_settings, returns_of
    from rltok.objective.score_function import ScoreFunction

    @dataclass
    class ShortSightedSettings(Section):
        kind: str = "short_sighted"
        gamma: float = 0.5
        stride: int = 4

    ESTIMATORS.register("short_sighted", ScoreFunction, ShortSightedSettings)
    o = ObjectiveConfig(estimator="short_sighted")
    assert returns_of(o).gamma == 0.5 and returns_of(o).batch_baseline  # its own gamma, the default baseline
    assert estimator_settings(o).flip_stride == 4
    assert returns_of(ObjectiveConfig()).gamma == 0.99


def test_a_rule_built_on_the_learned_policy_is_a_learned_rule_to_the_checks(registries_restored):
    """Settling (objective.policy_until) and a second stage ask whether the rule is the learned
    policy by its settings class, not its name: a plugin's rule whose settings extend rl's passes,
    a fixed rule of its own is refused as uniform cuts are."""
    from dataclasses import dataclass

    from rltok.config import RLChunkerSettings, Section
    from rltok.model.chunkers import RLPolicy, UniformChunker

    @dataclass
    class GentleSettings(RLChunkerSettings):
        kind: str = "gentle_rl"
        share: float = 0.5

    @dataclass
    class StrideSettings(Section):
        kind: str = "strided"

    CHUNKERS.register("gentle_rl", RLPolicy, GentleSettings)
    CHUNKERS.register("strided", UniformChunker, StrideSettings)
    assert load_config("test", overrides=["model.chunker=gentle_rl", "objective.policy_until=0.5"]).objective.policy_until == 0.5
    assert load_config("test", overrides=["model.chunker=gentle_rl", "model.stages=2"]).model.stages == 2
    # and, as rl, it needs the lexicon recipe for a tokenizer phase
    with pytest.raises(ConfigError, match="tokenizer_phase needs"):
        load_config("test", overrides=["model.chunker=gentle_rl", "objective.tokenizer_phase=0.5"])
    for kind in ("strided", "uniform"):
        with pytest.raises(ConfigError, match="settles a learned boundary rule"):
            load_config("test", overrides=[f"model.chunker={kind}", "objective.policy_until=0.5"])
        with pytest.raises(ConfigError, match="stages=2 needs"):
            load_config("test", overrides=[f"model.chunker={kind}", "model.stages=2"])


def test_an_installed_callable_plugin_loads_once_when_a_name_is_unknown(tmp_path, monkeypatch, registries_restored):
    """An entry point naming a function: called once, the first time a registry lacks a name."""
    site = tmp_path / "site"
    (site / "cb_rules-1.0.dist-info").mkdir(parents=True)
    (site / "cb_rules-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: cb-rules\nVersion: 1.0\n")
    (site / "cb_rules-1.0.dist-info" / "entry_points.txt").write_text("[rltok.plugins]\ncb = cb_rules:register\n")
    (site / "cb_rules.py").write_text("calls = []\n\n\ndef register():\n    from rltok.config import REWARDS\n"
                                      "    from rltok.objective.rewards import Final\n\n"
                                      "    calls.append(1)\n    REWARDS.register('cb_final', Final)\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugin_state, "_entry_points_done", False)
    monkeypatch.delitem(sys.modules, "cb_rules", raising=False)
    cfg = load_config("test", overrides=["objective.reward=cb_final"])
    assert cfg.plugins == ("cb_rules:register",)
    assert cfg.to_dict()["plugin_sources"] == {"cb_rules:register": {"provides": ["objective.reward=cb_final"],
                                                                      "distribution": "cb-rules"}}
    with pytest.raises(ConfigError, match="did you mean"):
        load_config("test", overrides=["objective.reward=cb_finl"])
    assert sys.modules["cb_rules"].calls == [1]
    monkeypatch.delitem(sys.modules, "cb_rules")
