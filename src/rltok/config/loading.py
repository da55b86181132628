"""The whole configuration and how it is built: defaults, a preset, a JSON/TOML file, then
`section.key=value` overrides (docs/CONFIG.md, "Config layout")."""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rltok.config import plugins as _plugins
from rltok.config.presets import PRESETS
from rltok.config.registry import Section
from rltok.config.registry import unknown as _unknown
from rltok.config.sections import (RECIPES, REGISTRIES, ConfigError, DataConfig, ModelConfig, ObjectiveConfig,
                                   RLChunkerSettings, TrainConfig)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # plugins to load before the config is read: module names (pkg.rules, pkg.rules:register) or
    # .py files; validation adds those the chosen components come from
    plugins: tuple[str, ...] = ()

    def validate(self) -> "Config":
        for f in dataclasses.fields(self):  # a Config built by hand: each section of its own class
            kind = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            if isinstance(kind, type) and not isinstance(getattr(self, f.name), kind):
                raise ConfigError(f"config section {f.name!r} must be a {kind.__name__}, got "
                                  f"{type(getattr(self, f.name)).__name__}")
        self.model.validate()
        self.objective.validate()
        self.data.validate()
        self.train.validate()
        m, o = self.model, self.objective
        estimator, rate = o.estimator.kind, o.rate.kind
        baseline = o.estimator.baseline_parts() if estimator == "score_function" else set()
        lexicon_weight = o.estimator.lexicon.weight if estimator == "flips" else 0.0
        if "value" in baseline:
            m.value_head = True  # the critic is part of the model (and its checkpoints)
        if self.train.batch_size % o.group_size:
            raise ConfigError("train.batch_size must be a multiple of objective.group_size "
                              "(it counts segmentations; batch_size / group_size distinct sequences)")
        if m.stages == 2 and rate == "none":
            raise ConfigError("model.stages=2 needs objective.rate=penalty or lagrange: the supertoken "
                              "policy has no compute price of its own and would drift without a rate target")
        if estimator == "flips" and m.stages == 2:
            raise ConfigError("objective.estimator=flips supports one stage only (model.stages=1); train "
                              "two-stage models with objective.recipe=reference")
        learned = m.arch == "hourglass" and isinstance(m.chunker, RLChunkerSettings)  # rl, or a plugin's rule built on it
        if o.tokenizer_phase > 0 and learned and not (
                estimator == "flips" and lexicon_weight > 0 and not o.estimator.model_pass):
            raise ConfigError("objective.tokenizer_phase needs a boundary credit that does not read the full model: "
                              "the lexicon recipe (objective.recipe=lexicon: flips, lexicon.weight > 0, "
                              "model_pass=false)")
        if o.policy_until < 1 and not learned:
            raise ConfigError("objective.policy_until settles a learned boundary rule: it needs model.arch=hourglass "
                              "with model.chunker=rl (or a rule built on it)")
        if o.policy_until < 1 and o.group_size > 1:
            raise ConfigError("objective.policy_until with objective.group_size > 1: once settled the group's "
                              "segmentations are identical, computed and charged group_size times")
        if self.train.seq_len > m.max_seq_len:
            raise ConfigError("train.seq_len exceeds model.max_seq_len")
        named = [_plugins.canonical(s) for s in _named_plugins(self.plugins)]
        self.plugins = tuple(dict.fromkeys([*named, *plugin_sources(self)]))
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as a mapping; `plugin_sources` (when a component comes from a plugin) is a
        record of where, read by nothing but the message naming a plugin that is missing."""
        d = dataclasses.asdict(self)
        sources = plugin_sources(self)
        if sources:
            d["plugin_sources"] = sources
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        cfg = cls()
        apply_dict(cfg, d)
        return cfg


def _kind_at(d: dict, path: str) -> str | None:
    """The name a registry's config path holds in a config's mapping; None where the chosen kinds
    have no such path."""
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d.get("kind") if isinstance(d, dict) else d if isinstance(d, str) else None


def plugin_sources(cfg: "Config") -> dict[str, dict]:
    """The plugins (by the spec that loads them) that the config's components come from, each with
    the components it provides (`path=kind`) and its installed distribution where known. A
    component registered by code outside rltok, not as a plugin, names its module."""
    out: dict[str, dict] = {}
    d = dataclasses.asdict(cfg)
    for registry in REGISTRIES:
        kind = _kind_at(d, registry.key)
        entry = registry.entries.get(kind) if isinstance(kind, str) else None
        if entry is None:
            continue
        origin = entry.origin
        if origin is None:
            module = entry.module()
            if not module or module == "rltok" or module.startswith("rltok.") or module == "__main__":
                continue  # built in, or a script's own (which no other process can import)
            origin = _plugins.Origin(module, _plugins.distribution_of(module))
        record = out.setdefault(origin.spec, {"provides": []})
        if origin.distribution:
            record["distribution"] = origin.distribution
        record["provides"].append(f"{registry.key}={kind}")
    return out


def _named_plugins(value: Any, base: Path | None = None) -> list[str]:
    """The plugin specs of a `plugins` value (a list, or `a,b` from the command line); a relative
    .py path in a config file is relative to that file."""
    if isinstance(value, str):
        items: list[Any] = value.strip().strip("[]()").split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"config key 'plugins' expects a list of module names or .py files, got {value!r}")
    specs = [str(i).strip().strip("'\"").strip() for i in items]
    specs = [s for s in specs if s]
    if base is not None:
        specs = [str(base / s) if _plugins.is_file_spec(s) and not Path(s).expanduser().is_absolute() else s
                 for s in specs]
    return specs


def _require_plugins(d: dict) -> None:
    """A saved config whose components come from plugins not loaded here: one PluginError naming
    the plugins and the kinds unknown without them. Nothing it names is imported (a folder from
    elsewhere runs no code); installed entry-point plugins load when a registry is asked."""
    named = d.get("plugins")
    if not named:
        return
    try:
        missing = [s for s in _named_plugins(named) if not _plugins.is_loaded(s)]
    except ConfigError:
        return  # a malformed value: reading the key says so
    if not missing:
        return
    unknown_kinds = {}
    for registry in REGISTRIES:
        kind = _kind_at(d, registry.key)
        if isinstance(kind, str) and kind not in registry:
            unknown_kinds[f"{registry.key}={kind}"] = f"{registry.key} kind {kind!r}"
    if not unknown_kinds:
        return
    records = {s: _recorded(d.get("plugin_sources"), s) for s in missing}
    needed = [s for s in missing if records[s][0] & set(unknown_kinds)] or missing
    dists = sorted({records[s][1] for s in needed if records[s][1]})
    install = f"install {' '.join(map(_shown, dists))} (its entry point loads by itself), or " if dists else ""
    raise _plugins.MissingPlugin(
        f"needs the plugin{'s' if len(needed) > 1 else ''} {', '.join(repr(s) for s in needed)} for "
        f"{', '.join(unknown_kinds.values())}, unknown without it: {install}load it with "
        f"{' '.join('--plugin ' + _shown(s) for s in needed)} (in Python: rltok.config.load_plugin)")


def _recorded(sources: Any, spec: str) -> tuple[set[str], str | None]:
    """What a saved config's `plugin_sources` says of a plugin: the `path=kind`s it provides and its
    distribution (nothing, where the record is not of that shape: it comes from a file)."""
    record = sources.get(spec) if isinstance(sources, dict) else None
    record = record if isinstance(record, dict) else {}
    provides = record.get("provides")
    dist = record.get("distribution")
    return ({p for p in provides if isinstance(p, str)} if isinstance(provides, list) else set(),
            dist if isinstance(dist, str) else None)


def _shown(text: str) -> str:
    """A name from a file, as one line can show it."""
    return text if text.isprintable() else repr(text)


# the component sections of a Config (their dotted paths): `path=NAME` chooses a kind
SECTION_PATHS = ("model.chunker", "objective.reward", "objective.estimator", "objective.rate",
                 "objective.estimator.price")


@functools.cache  # resolving the hints is the slow part of loading a config, and a class's never change
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


_BOOLS = {**dict.fromkeys(("1", "true", "yes", "on"), True), **dict.fromkeys(("0", "false", "no", "off"), False)}


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Convert a parsed value (or a command-line string) to the field's declared type."""
    origin = typing.get_origin(typ)
    try:
        if typ is bool:
            return _BOOLS[value.lower()] if isinstance(value, str) else bool(value)
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
    except (ValueError, TypeError, OverflowError, KeyError):  # 1e400 as an int overflows; "maybe" is no bool
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


# Keys of the flat layout older versions wrote (saved configs, run folders, model folders, command
# lines), and where each now lives: a component's settings moved into its own section. A saved
# config still loads (one note says it was read in the old layout); a key that belongs to another
# kind than the one chosen is dropped when it holds its old default and noted otherwise.
LEGACY_KEYS: dict[str, tuple[tuple[str, ...], Any]] = {  # old key -> (where it lives now, its old default)
    "model.policy_window": (("model.chunker.window",), 1),
    "model.policy_detach": (("model.chunker.detach",), False),
    "model.fixed_stride": (("model.chunker.stride",), 5),
    "model.hnet_ratio_weight": (("model.chunker.ratio_weight",), 0.03),
    "model.gumbel_temperature": (("model.chunker.temperature",), 1.0),
    "model.gumbel_prior_weight": (("model.chunker.prior_weight",), 1.0),
    "objective.gamma": (("objective.estimator.gamma",), 0.99),
    "objective.baseline": (("objective.estimator.baseline",), "batch"),
    "objective.gae_lambda": (("objective.estimator.gae_lambda",), 0.95),
    "objective.normalize_advantages": (("objective.estimator.normalize_advantages",), False),
    "objective.flip_stride": (("objective.estimator.stride",), 16),
    "objective.flip_model_pass": (("objective.estimator.model_pass",), True),
    "objective.lexicon_weight": (("objective.estimator.lexicon.weight",), 0.0),
    "objective.lexicon_size": (("objective.estimator.lexicon.size",), 1 << 20),
    "objective.lexicon_decay": (("objective.estimator.lexicon.decay",), 0.995),
    "objective.rate_control": (("objective.rate.kind",), "penalty"),
    "objective.rate_weight": (("objective.rate.weight",), 0.01),
    "objective.lagrange_lr": (("objective.rate.lr", "objective.estimator.price.lr"), 0.2),
    "objective.lagrange_gain": (("objective.rate.gain", "objective.estimator.price.gain"), 5.0),
    "objective.compute_price": (("objective.rate.compute_price",), 0.0),
    "objective.cost_estimator": (("objective.rate.cost_estimator",), "exact"),
    # the flips' credit price was a switch and a mode: now one section with a kind
    "objective.flip_rate_control": (("objective.estimator.price.kind",), False),
    "objective.rate_price": (("objective.estimator.price.kind",), "target"),
}
# the old keys that choose a kind: applied before the settings that kind may own
LEGACY_KIND_KEYS = frozenset(k for k, (paths, _) in LEGACY_KEYS.items() if paths[0].endswith(".kind"))


def _legacy_value(key: str, value: Any) -> Any:
    """An old key's value as its new place takes it (the credit price's switch and mode become a kind)."""
    if key == "objective.flip_rate_control":
        return "target" if _coerce(value, bool, key) else "none"
    if key == "objective.rate_price" and value == "target":
        return None  # the old mode's default: the switch alone says whether there is a price
    return value


def _section_registry(parent: Any, name: str):
    """The registry of a component field (a section with a kind), or None for a plain field."""
    return next((f.metadata.get("registry") for f in dataclasses.fields(parent) if f.name == name), None)


def _set_kind(parent: Any, name: str, kind: Any, where: str) -> None:
    """Choose a component's kind. Settings both kinds have keep their value; the new kind's own
    settings start at their defaults."""
    registry = _section_registry(parent, name)
    current = getattr(parent, name)
    kind = _coerce(kind, str, where + "kind")
    if kind == current.kind:
        return
    new = registry.settings(kind)
    old_defaults = type(current)()
    for f in dataclasses.fields(new):
        if f.name != "kind" and hasattr(current, f.name) and getattr(current, f.name) != getattr(old_defaults, f.name):
            setattr(new, f.name, getattr(current, f.name))
    setattr(parent, name, new)


def _is_section(parent: Any, name: str) -> bool:
    return _section_registry(parent, name) is not None


def _kind_first(obj: Any, items: list[tuple[str, Any]], where: str) -> list[tuple[str, Any]]:
    """Assignments that choose a kind go before the settings that kind may own."""
    def chooses_kind(item: tuple[str, Any]) -> bool:
        key, value = item
        return (key == "kind" or where + key in LEGACY_KIND_KEYS
                or (key in _field_types(type(obj)) and _is_section(obj, key) and isinstance(value, str)))
    return sorted(items, key=lambda item: not chooses_kind(item))


def apply_dict(obj: Any, d: dict[str, Any], where: str = "", notes: list[str] | None = None) -> None:
    """Set the keys of mapping `d` on section `obj` (dotted prefix `where`), nested sections
    included; a component section takes a mapping with a kind, or just its kind's name."""
    top = notes is None
    notes = [] if top else notes
    if isinstance(obj, Config):
        _require_plugins(d)
        d = {k: v for k, v in d.items() if k != "plugin_sources"}  # a record, not a setting
        if "plugins" in d:
            d["plugins"] = _named_plugins(d["plugins"])
    if isinstance(obj, Section) and d.get("kind", obj.kind) != obj.kind:
        raise ConfigError(f"{where}kind is chosen where the section is set ({where.rstrip('.')}=NAME)")
    d = {k: v for k, v in d.items() if not (k == "kind" and isinstance(obj, Section))}
    for key, value in _kind_first(obj, list(d.items()), where):
        full = where + key
        if full in REMOVED_KEYS:
            warnings.warn(f"{full} was removed ({REMOVED_KEYS[full]}); ignored", stacklevel=2)
        elif full in LEGACY_KEYS:
            _apply_legacy(_root_of(obj, where), full, value, notes)
        else:
            _apply_field(obj, key, value, where, notes)
    if top and notes:
        _note_legacy(notes)


def _apply_field(obj: Any, key: str, value: Any, where: str, notes: list[str]) -> None:
    types = _field_types(type(obj))
    if key not in types:
        raise _unknown(key, _settings(obj, types, key), where, what=_what(obj))
    current = getattr(obj, key)
    if _is_section(obj, key):
        if isinstance(value, dict):
            value = dict(value)
            if "kind" in value:
                _set_kind(obj, key, value.pop("kind"), f"{where}{key}.")
            apply_dict(getattr(obj, key), value, f"{where}{key}.", notes)
        elif isinstance(value, str):
            _set_kind(obj, key, value, f"{where}{key}.")
        else:
            raise ConfigError(f"{where}{key} is a component: give its kind ({where}{key}=NAME) or a mapping "
                              f"with a kind and its settings")
    elif dataclasses.is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"config section {where}{key!r} must be a mapping")
        apply_dict(current, value, f"{where}{key}.", notes)
    else:
        setattr(obj, key, _coerce(value, types[key], where + key))


def _settings(obj: Any, types: dict, key: str) -> list[str]:
    """The keys an unknown `key` is matched against: a component's settings, its `kind` only
    where the key looks like it (a misspelt setting is not a misspelt kind)."""
    import difflib

    if isinstance(obj, Section) and not difflib.get_close_matches(key, ["kind"], n=1, cutoff=0.75):
        return [k for k in types if k != "kind"]
    return list(types)


def _what(obj: Any) -> str:
    """How an unknown key is named: a component's keys depend on its kind."""
    return f"config key (for kind {obj.kind!r})" if isinstance(obj, Section) else "config key"


def _root_of(obj: Any, where: str) -> Any:
    """`obj` is the section at `where` ("model." / "objective."): legacy keys are paths from the
    Config, so they are applied from a stand-in for it whose one attribute is `obj`."""
    name = where.rstrip(".")
    return SimpleNamespace(**{name: obj}) if "." not in name else obj


def _apply_legacy(root: Any, key: str, value: Any, notes: list[str]) -> None:
    """An old flat key, applied where it lives now. Not applicable to the chosen kind (the flat
    layout had every kind's keys, most unused): dropped at its old default, noted otherwise."""
    given, value = value, _legacy_value(key, value)
    if value is None or (value == "target" and _price_kind(root) not in (None, "none")):
        return  # the old switch turns a price on; it never overrides the mode chosen with it
    applied = [path for path in LEGACY_KEYS[key][0] if _set_path(root, path, value)]
    if applied:
        notes.append(f"{key} -> {applied[0]}")
        return
    here = " or ".join(LEGACY_KEYS[key][0])
    if given != LEGACY_KEYS[key][1]:
        warnings.warn(f"{key}={given!r} ignored: it is now {here}, which the chosen kind does not have", stacklevel=3)


def _price_kind(root: Any) -> str | None:
    """The kind of the flips' credit price under `root`, if the estimator has one."""
    price = getattr(getattr(getattr(root, "objective", None), "estimator", None), "price", None)
    return getattr(price, "kind", None)


def _set_path(root: Any, path: str, value: Any) -> bool:
    """Set a dotted path from `root`; False when a section on the way (a component of another
    kind) has no such key."""
    parts = path.split(".")
    obj = root
    for i, part in enumerate(parts[:-1]):
        if not hasattr(obj, part):
            return False
        if parts[i + 1] == "kind" and i + 1 == len(parts) - 1:
            _set_kind(obj, part, value, ".".join(parts[: i + 1]) + ".")
            return True
        obj = getattr(obj, part)
    if not dataclasses.is_dataclass(obj) or parts[-1] not in _field_types(type(obj)):
        return False
    setattr(obj, parts[-1], _coerce(value, _field_types(type(obj))[parts[-1]], path))
    return True


def _note_legacy(notes: list[str]) -> None:
    shown = ", ".join(notes[:3]) + (f" and {len(notes) - 3} more" if len(notes) > 3 else "")
    warnings.warn(f"read {len(notes)} key(s) of the older flat config layout: {shown}", stacklevel=3)


def _kind_override(assignment: str) -> bool:
    """Whether an override chooses a component's kind (applied before the other overrides)."""
    dotted = assignment.split("=", 1)[0].strip()
    return dotted.endswith(".kind") or dotted in SECTION_PATHS or dotted in LEGACY_KIND_KEYS


def _split_override(assignment: str) -> tuple[str, str]:
    """`section.key=value` as (dotted key, raw value); anything else is refused."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like section.key=value")
    dotted, raw = assignment.split("=", 1)
    return dotted.strip(), raw


def apply_override(cfg: Config, assignment: str) -> None:
    """Apply one `section.key=value` override (value parsed as JSON when it looks like JSON).
    `a.component=NAME` chooses a component's kind, `a.component.key=value` sets its settings."""
    dotted, raw = _split_override(assignment)
    if dotted in REMOVED_KEYS:
        raise ConfigError(f"config key {dotted!r} was removed ({REMOVED_KEYS[dotted]})")
    if dotted in LEGACY_KEYS:
        notes: list[str] = []
        _apply_legacy(cfg, dotted, raw, notes)
        if notes:
            warnings.warn(f"{dotted} is now {notes[0].split(' -> ')[1]}", stacklevel=2)
        return
    if dotted == "plugins":  # named by the user: loaded now, before any kind they provide is read
        cfg.plugins = tuple(_named_plugins(raw))
        _plugins.load_plugins(cfg.plugins)
        return
    parts = dotted.split(".")
    obj: Any = cfg
    parent = None
    for i, part in enumerate(parts):
        types = _field_types(type(obj))
        where = ".".join(parts[:i]) + ("." if i else "")
        if part == "kind" and isinstance(obj, Section) and i == len(parts) - 1:
            _set_kind(parent, parts[-2], raw, where)
            return
        if part not in types:
            owners = [name for name, value in vars(cfg).items() if i == 0 and dataclasses.is_dataclass(value)
                      and part in _field_types(type(value))]  # a key written without its section
            if owners:
                raise ConfigError(f"unknown config key {part!r}; did you mean "
                                  f"{' or '.join(repr(f'{o}.{dotted}') for o in owners)}?")
            raise _unknown(part, _settings(obj, types, part), where, what=_what(obj))
        if i == len(parts) - 1:
            if _is_section(obj, part):
                _set_kind(obj, part, raw, f"{dotted}.")
            elif dataclasses.is_dataclass(getattr(obj, part)):
                raise ConfigError(f"{dotted!r} is a section; set one of its keys, e.g. {dotted}.<key>=...")
            else:
                setattr(obj, part, _coerce(raw, types[part], dotted))
        else:
            parent, obj = obj, getattr(obj, part)
            if not dataclasses.is_dataclass(obj):
                raise ConfigError(f"{'.'.join(parts[: i + 1])!r} is not a section")


def with_settings(section: Any, mapping: dict[str, Any], where: str) -> Any:
    """A copy of a config section with `mapping` applied as a config file would apply it (a
    component takes a mapping with a kind and its settings, or just its kind), validated where it
    can be alone: variants of one section for instruments that compare settings."""
    new = copy.deepcopy(section)
    apply_dict(new, mapping, where)
    return new


def load_config(preset: str = "tiny", file: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the preset, then a JSON/TOML file, then `key=value` overrides. The recipe
    (objective.recipe, from the preset, the file or an override; the last one named wins) sets
    its objective keys first, so any of them set explicitly win over it."""
    if not isinstance(preset, str):
        raise TypeError(f"preset is a name ({', '.join(PRESETS)}), got {type(preset).__name__}")
    if isinstance(overrides, str):  # a bare string would be read one character at a time
        raise TypeError(f"overrides is a list of 'section.key=value' strings, got the string {overrides!r}")
    if preset not in PRESETS:
        raise _unknown(preset, list(PRESETS), "", what="preset")
    cfg = Config.from_dict(PRESETS[preset])
    data = _read_config_file(file) if file else None
    # the plugins the file and the overrides name, first: the kinds they provide are read below
    if data is not None and "plugins" in data:
        data = {**data, "plugins": _named_plugins(data["plugins"], Path(file).parent)}
        _plugins.load_plugins(data["plugins"])
    pairs = [_split_override(ov) for ov in overrides or []]  # checked before the plugins and the recipe read them
    for key, value in pairs:
        if key == "plugins":
            _plugins.load_plugins(_named_plugins(value))
    recipe = cfg.objective.recipe
    if data and isinstance(data.get("objective"), dict) and "recipe" in data["objective"]:
        recipe = str(data["objective"]["recipe"])
    recipe = next((value.strip() for key, value in reversed(pairs) if key == "objective.recipe"), recipe)
    if recipe not in RECIPES:
        raise _unknown(recipe, list(RECIPES), "", what="objective.recipe")
    cfg.objective.recipe = recipe
    apply_dict(cfg.objective, RECIPES[recipe], "objective.")
    if data is not None:
        apply_dict(cfg, data)
    for ov in sorted(overrides or [], key=lambda ov: not _kind_override(ov)):
        apply_override(cfg, ov)
    return cfg.validate()


MAX_CONFIG_BYTES = 1 << 20


def _read_config_file(file: str) -> dict:
    """A JSON or TOML config file's mapping of sections, or a clear ConfigError."""
    from rltok.config.files import read_json  # depth and number bounds: one error, never a RecursionError

    data = read_json(file, "config file", MAX_CONFIG_BYTES, kind="toml" if Path(file).suffix == ".toml" else "json")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {file} must hold a mapping of sections, got {type(data).__name__}")
    return data
