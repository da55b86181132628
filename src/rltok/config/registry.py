"""Registries of the components a config names by kind, each entry a name, its settings dataclass and
the component. Built-in components are "module:attribute" strings imported only when built, so
reading a config never imports torch."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass
from typing import Any

from rltok.config import plugins
from rltok.config.errors import ConfigError

__all__ = ["ConfigError", "Entry", "Registry", "Section", "unknown"]


@dataclass
class Section:
    """A component's settings: its kind (the registry name) and what that kind reads."""
    kind: str = ""

    def validate(self, where: str) -> None:
        """Raise ConfigError for a bad value; `where` is the section's dotted path."""


@dataclass
class Entry:
    name: str
    settings: type[Section]
    target: Any  # the component class, or "module:attribute" resolved on first use
    origin: plugins.Origin | None = None  # the plugin that registered it (None: rltok's own or user code)

    def module(self) -> str:
        """The module the component is defined in (without importing it)."""
        if isinstance(self.target, str):
            return self.target.partition(":")[0]
        return getattr(self.target, "__module__", "") or ""

    def component(self) -> Any:
        if isinstance(self.target, str):
            module, attr = self.target.split(":")
            self.target = getattr(importlib.import_module(module), attr)
        return self.target


class Registry:
    """Name -> (settings dataclass, component) for one kind of component."""

    def __init__(self, key: str, base: type[Section] = Section):
        self.key = key  # the config path whose `kind` names an entry, for messages
        self.base = base  # what the settings of an entry registered without its own derive from
        self.entries: dict[str, Entry] = {}

    def register(self, name: str, target: Any, settings: type[Section] | None = None) -> Entry:
        """Add (or replace) a component. Without `settings` the section holds its kind alone."""
        if settings is None:
            settings = dataclasses.make_dataclass(f"{name.title().replace('_', '')}Settings", [], bases=(self.base,))
        if not (dataclasses.is_dataclass(settings) and issubclass(settings, self.base)):
            raise TypeError(f"settings of {self.key} {name!r} must be a dataclass subclassing {self.base.__name__}")
        self.entries[name] = Entry(name, settings, target, plugins.current_origin())
        return self.entries[name]

    def unregister(self, name: str) -> None:
        self.entries.pop(name, None)

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: str) -> bool:
        if name not in self.entries:
            plugins.load_entry_points()  # an installed plugin may provide it
        return name in self.entries

    def entry(self, name: str) -> Entry:
        if name not in self:
            raise unknown(name, self.names(), "", what=self.key)
        return self.entries[name]

    def settings(self, name: str, **values: Any) -> Section:
        """A fresh settings object of kind `name` (defaults, then `values`)."""
        return self.entry(name).settings(kind=name, **values)

    def component(self, name: str) -> Any:
        return self.entry(name).component()

    def build(self, section: Section, *args: Any, **kwargs: Any) -> Any:
        """The component `section.kind` names, made from its settings: `cls.from_settings(section,
        *args)` when the class defines it, else `cls(*args)`."""
        cls = self.component(section.kind)
        make = getattr(cls, "from_settings", None)
        return make(section, *args, **kwargs) if make is not None else cls(*args, **kwargs)


def unknown(key: str, choices: list[str], where: str, what: str = "config key") -> ConfigError:
    close = difflib.get_close_matches(key, choices, n=1)
    hint = f"; did you mean {where + close[0]!r}?" if close else f"; valid: {', '.join(sorted(choices))}"
    return ConfigError(f"unknown {what} {where + key!r}{hint}")
