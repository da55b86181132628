"""The whole configuration and how it is built: defaults, then a preset, then a JSON/TOML file,
then `section.key=value` overrides. Unknown keys are rejected with a suggestion, so a typo never
silently falls back to a default; keys removed from the schema are ignored with a note when a saved
config carries them."""

from __future__ import annotations

import dataclasses
import json
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rltok.config.presets import PRESETS
from rltok.config.sections import (RECIPES, ConfigError, DataConfig, ModelConfig, ObjectiveConfig, TrainConfig,
                                   _unknown)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> "Config":
        self.model.validate()
        self.objective.validate()
        self.data.validate()
        self.train.validate()
        if "value" in self.objective.baseline_parts():
            self.model.value_head = True  # the critic is part of the model (and its checkpoints)
        if self.train.batch_size % self.objective.group_size:
            raise ConfigError("train.batch_size must be a multiple of objective.group_size "
                              "(it counts segmentations; batch_size / group_size distinct sequences)")
        if self.model.stages == 2 and self.objective.rate_control == "none":
            raise ConfigError("model.stages=2 needs objective.rate_control=penalty or lagrange: the supertoken "
                              "policy has no compute price of its own and would drift without a rate target")
        if self.objective.estimator == "flips" and self.model.stages == 2:
            raise ConfigError("objective.estimator=flips supports one stage only (model.stages=1); train "
                              "two-stage models with objective.recipe=reference")
        o, m = self.objective, self.model
        if o.tokenizer_phase > 0 and m.arch == "hourglass" and m.chunker == "rl" and not (
                o.estimator == "flips" and o.lexicon_weight > 0 and not o.flip_model_pass):
            raise ConfigError("objective.tokenizer_phase needs a boundary credit that does not read the full model: "
                              "the lexicon recipe (objective.recipe=lexicon: flips, lexicon_weight > 0, "
                              "flip_model_pass=false)")
        if self.train.seq_len > self.model.max_seq_len:
            raise ConfigError("train.seq_len exceeds model.max_seq_len")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        cfg = cls()
        apply_dict(cfg, d)
        return cfg


def _field_types(obj: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(type(obj))
    return {f.name: hints[f.name] for f in dataclasses.fields(obj)}


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Convert a parsed value (or a command-line string) to the field's declared type."""
    origin = typing.get_origin(typ)
    try:
        if typ is bool:
            if isinstance(value, str):
                low = value.lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if typ in (int, float) and isinstance(value, bool):  # JSON true is not the number 1
            raise ValueError(value)
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if typ is float:
            return float(value)
        if typ is str:
            if isinstance(value, (dict, list)):  # a JSON structure where a name/path belongs
                raise ValueError(value)
            return str(value)
        if origin is tuple:
            if isinstance(value, str):
                value = [v for v in value.strip("()[] ").split(",") if v]
            args = typing.get_args(typ)
            if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
                return tuple(_coerce(v, args[0], key) for v in value)
            return tuple(_coerce(v, a, key) for v, a in zip(value, args, strict=True))
    except (ValueError, TypeError, OverflowError):  # OverflowError: 1e400 as an int
        raise ConfigError(f"config key {key!r} expects {getattr(typ, '__name__', typ)}, got {value!r}") from None
    return value


# Keys that were removed because they changed nothing (set by no preset or recipe, or only by
# experiments that found no effect). Saved configs and checkpoints still carry them: loading
# ignores them with a note; a command-line override of one is an error.
REMOVED_KEYS: dict[str, str] = {f"objective.{k}": why for k, why in {
    "flip_center": "the flips' credit is always centred",
    "flip_normalize": "the flips' credit is always scaled",
    "value_weight": "the critic's weight is 0.1",
    "lexicon_concentration": "the lexicon's concentration is 100",
    "lexicon_lag": "it changed nothing",
    "lexicon_collapse_blanks": "it changed nothing",
    "flip_rate_start": "it changed nothing",
    "flip_rate_anneal_steps": "it changed nothing",
    "lexicon_context": "it changed nothing (the bigram lexicon)",
    "lexicon_credit": "it changed nothing (the exact lexicon credit)",
    "flip_weight": "it changed nothing",
}.items()}


def apply_dict(obj: Any, d: dict[str, Any], where: str = "") -> None:
    types = _field_types(obj)
    for key, value in d.items():
        if where + key in REMOVED_KEYS:
            warnings.warn(f"{where + key} was removed ({REMOVED_KEYS[where + key]}); ignored", stacklevel=2)
            continue
        if key not in types:
            raise _unknown(key, list(types), where)
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config section {where}{key!r} must be a mapping")
            apply_dict(current, value, f"{where}{key}.")
        else:
            setattr(obj, key, _coerce(value, types[key], where + key))


def apply_override(cfg: Config, assignment: str) -> None:
    """Apply one `section.key=value` override (value parsed as JSON when it looks like JSON)."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like section.key=value")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if ".".join(parts) in REMOVED_KEYS:
        raise ConfigError(f"config key {'.'.join(parts)!r} was removed ({REMOVED_KEYS['.'.join(parts)]})")
    obj: Any = cfg
    for i, part in enumerate(parts):
        types = _field_types(obj)
        if part not in types:
            raise _unknown(part, list(types), ".".join(parts[:i]) + ("." if i else ""))
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(getattr(obj, part)):
                raise ConfigError(f"{dotted!r} is a section; set one of its keys, e.g. {dotted}.<key>=...")
            setattr(obj, part, _coerce(raw, types[part], dotted))
        else:
            obj = getattr(obj, part)
            if not dataclasses.is_dataclass(obj):
                raise ConfigError(f"{'.'.join(parts[: i + 1])!r} is not a section")


def load_config(preset: str = "tiny", file: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the preset, then a JSON/TOML file, then `key=value` overrides. The recipe
    (objective.recipe, from the preset, the file or an override; the last one named wins) sets
    its objective keys first, so any of them set explicitly win over it."""
    if preset not in PRESETS:
        raise _unknown(preset, list(PRESETS), "", what="preset")
    cfg = Config.from_dict(PRESETS[preset])
    data = _read_config_file(file) if file else None
    recipe = cfg.objective.recipe
    if data and isinstance(data.get("objective"), dict) and "recipe" in data["objective"]:
        recipe = str(data["objective"]["recipe"])
    for ov in overrides or []:
        if ov.split("=", 1)[0].strip() == "objective.recipe":
            recipe = ov.split("=", 1)[1].strip()
    if recipe not in RECIPES:
        raise _unknown(recipe, list(RECIPES), "", what="objective.recipe")
    cfg.objective.recipe = recipe
    apply_dict(cfg.objective, RECIPES[recipe], "objective.")
    if data is not None:
        apply_dict(cfg, data)
    for ov in overrides or []:
        apply_override(cfg, ov)
    return cfg.validate()


MAX_CONFIG_BYTES = 1 << 20


def _read_config_file(file: str) -> dict:
    """A JSON or TOML config file's mapping of sections, or a clear ConfigError."""
    path = Path(file)
    if path.exists() and not path.is_file():  # a folder, a FIFO, /dev/zero: say so, do not read forever
        raise ConfigError(f"config file {file} is {'a folder' if path.is_dir() else 'not a regular file'}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {file}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {file} is larger than {MAX_CONFIG_BYTES:,} bytes: not a config")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {file}: {e}") from None
    if path.suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {file} is not valid TOML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"config file {file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {file} must hold a mapping of sections, got {type(data).__name__}")
    return data
