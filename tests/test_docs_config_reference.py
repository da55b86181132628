"""docs/CONFIG.md ends with every config key, its default and its comment, generated from the config
dataclasses by scripts/config_reference.py: stale tables fail here, and every key is in them."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_key_tables_in_config_md_are_what_the_code_declares():
    assert _script().main(["--check"]) == 0, "run: python scripts/config_reference.py"


def test_a_kind_registered_from_outside_stays_out_of_the_library_reference():
    from rltok.config import CHUNKERS
    from rltok.model.chunkers import UniformChunker

    class Outside(UniformChunker):  # a test's (or a plugin's) kind
        pass

    Outside.__module__ = "someone_elses_package"
    saved = dict(CHUNKERS.entries)
    CHUNKERS.register("outside_rule", Outside)
    try:
        assert "outside_rule" not in _script().reference()
        assert _script().main(["--check"]) == 0
    finally:
        CHUNKERS.entries.clear()
        CHUNKERS.entries.update(saved)


def test_every_key_and_every_kinds_setting_has_a_row_with_a_comment():
    from rltok.config import CHUNKERS, load_config

    text = _script().reference()
    cfg = load_config("tiny")

    def keys(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value) and not hasattr(value, "kind"):
                yield from keys(value, f"{prefix}.{f.name}")
            else:
                yield f"{prefix}.{f.name}"

    for section in ("model", "objective", "data", "train"):
        for key in keys(getattr(cfg, section), section):
            row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
            assert row is not None, f"{key} has no row"
            assert not row.endswith("| – |"), f"{key} is declared without a comment"
    for kind in _script().library_entries(CHUNKERS):
        assert f"| `{kind}` |" in text
    assert "`window` = `1`" in text  # a kind's own settings, with their defaults
