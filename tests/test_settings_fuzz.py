"""Any value for any setting or numeric flag ends a command with exit 0 or exactly one `error:`
line (exit 2), never a traceback. The keys are read from the Config dataclasses and the flags from
the argument parser, so new ones are covered without touching this file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rltok.cli import build_parser, main
from rltok.config import Config

def setting_keys(obj, prefix: str, choose: tuple = ()):
    """(overrides that choose the kinds on the way, dotted key) of every setting under `obj`: a
    component's settings for every registered kind of it, nested sections included."""
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        registry = f.metadata.get("registry")
        if registry is not None:
            yield choose, key  # the kind itself
            for kind in registry.names():
                yield from setting_keys(registry.settings(kind), key + ".", (*choose, f"{key}={kind}"))
        elif dataclasses.is_dataclass(value):
            yield from setting_keys(value, key + ".", choose)
        elif f.name != "kind":
            yield choose, key


# every setting: the sections' keys and, for every kind of every component, its own
SETTINGS = sorted(set(setting_keys(Config(), "")))
CONFIG_KEYS = [key for _, key in SETTINGS]


def nested(key: str, value) -> dict:
    """{"a": {"b": value}} for key "a.b"."""
    head, _, rest = key.partition(".")
    return {head: nested(rest, value) if rest else value}

NUMBERS = st.one_of(
    st.sampled_from([0, 1, -1, 2, 3, 8, 255, 256, 1024, 65536, 1 << 31, 1 << 32, 1 << 63, 10 ** 23, -(10 ** 23)]),
    st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1.0, -0.0, 1e-300, 1e300, 0.999, 1.0001])
)
ODD = st.one_of(st.booleans(), st.none(), st.text(max_size=12), st.lists(NUMBERS, max_size=4),
                st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def as_override_text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)) or value is None:
        return json.dumps(value)
    return str(value)


def one_error_or_success(capsys, argv: list[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code in (0, 2), f"{argv}: exit {code}\n{err}"
    assert "Traceback" not in err, f"{argv}:\n{err}"
    if code == 2:  # notes and progress may come first; the end is one error line
        lines = err.strip().splitlines()
        assert lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, f"{argv}:\n{err}"


def build_meta_model(cfg) -> None:
    """A valid config builds its model (on the meta device: no memory, no time)."""
    import torch

    from rltok.model.factory import build_model

    if cfg.model.arch == "bpe_token" or cfg.model.chunker.kind == "bpe":
        return  # fitted to training bytes
    with torch.device("meta"):
        build_model(cfg.model)


# 75 random draws a run: every setting also meets nine hostile values on this same path, below
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(setting=st.sampled_from(SETTINGS), value=st.one_of(NUMBERS, ODD))
def test_any_value_of_any_setting_on_the_command_line(capsys, setting, value):
    choose, key = setting
    argv = ["train", "--print-config", "--preset", "test", *choose, f"{key}={as_override_text(value)}"]
    one_error_or_success(capsys, argv)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(setting=st.sampled_from(SETTINGS), value=st.one_of(NUMBERS, ODD))
def test_any_value_of_any_setting_in_a_config_file(capsys, tmp_path_factory, setting, value):
    from rltok.config import ConfigError, load_config

    choose, key = setting
    path = tmp_path_factory.mktemp("cfg") / "c.json"
    path.write_text(json.dumps(nested(key, value)))
    one_error_or_success(capsys, ["train", "--print-config", "--preset", "test", "--config", str(path), *choose])
    try:
        cfg = load_config("test", str(path), choose)
    except ConfigError:
        return
    build_meta_model(cfg)


def numeric_flags() -> list[tuple[str, str]]:
    """(command, flag) of every option whose value is a number."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.type is not None and action.type is not str:
                found.append((command, max(action.option_strings, key=len)))
    return sorted(set(found))


NUMERIC_FLAGS = numeric_flags()

# what each command needs besides the flag; every path points nowhere, so a command ends at
# its first read (one error line) after its flags were checked
REQUIRED = {"train": ["--print-config", "--preset", "test"], "eval": ["-c", "{nowhere}"],
            "segment": ["-c", "{nowhere}", "hello"], "generate": ["-c", "{nowhere}", "hi"],
            "export": ["-c", "{nowhere}"],
            "prepare": ["{nowhere}", "--out", "{out}"],
            "compare": ["--data", "{nowhere}", "--out", "{out}", "--methods", "fixed"],
            "scaling": ["--grid", "{nowhere}", "--out", "{out}"]}


def test_every_numeric_flag_is_known():
    assert len(NUMERIC_FLAGS) > 20 and all(c in REQUIRED for c, _ in NUMERIC_FLAGS), NUMERIC_FLAGS


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(NUMERIC_FLAGS), value=st.one_of(NUMBERS, st.text(max_size=8)))
def test_any_value_of_any_numeric_flag(capsys, tmp_path_factory, flag, value):
    command, option = flag
    text = as_override_text(value)
    if isinstance(value, float) and math.isnan(value):
        text = "nan"
    tmp = tmp_path_factory.mktemp("flag")
    rest = [a.format(nowhere=tmp / "nowhere", out=tmp / "out") for a in REQUIRED[command]]
    one_error_or_success(capsys, [command, *rest, f"{option}={text}"])


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: " ".join([*s[0], s[1]]))
def test_every_setting_rejects_nan_and_wrong_types_or_takes_them(capsys, setting):
    choose, key = setting
    for value in ("nan", "inf", "-inf", "true", "[]", "{}", "1e400", "-1", "1e30"):
        one_error_or_success(capsys, ["train", "--print-config", "--preset", "test", *choose, f"{key}={value}"])


def test_the_settings_cover_every_kind_of_every_component():
    keys = set(CONFIG_KEYS)
    assert {"model.chunker.window", "model.chunker.stride", "objective.estimator.lexicon.decay",
            "objective.estimator.price.gain", "objective.rate.weight", "objective.rate.lr"} <= keys
