"""Components from outside the package: plugins, code that registers components when imported
(docs/EXTENDING.md). Every entry records its plugin (`origin`); a saved config never imports what
it names, so a folder from elsewhere runs no code."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rltok.config.errors import ConfigError

ENTRY_POINT_GROUP = "rltok.plugins"

_MODULE_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")


class PluginError(ConfigError):
    """A plugin that cannot be loaded, or a saved config that needs one not loaded."""


class MissingPlugin(PluginError):
    """A saved config (a run, a checkpoint, a model) whose components come from a plugin not
    loaded here. `about(subject)` says whose config it is."""

    def __init__(self, needs: str, subject: str = "the config"):
        super().__init__(f"{subject} {needs}")
        self.needs = needs

    def about(self, subject: str) -> "MissingPlugin":
        return MissingPlugin(self.needs, subject)


@dataclass(frozen=True)
class Origin:
    """Where a registered component came from: the spec that loads it again, and for an
    entry-point plugin the distribution that installed it."""
    spec: str
    distribution: str | None = None


_loaded: dict[str, Origin] = {}  # canonical spec -> origin, for plugins loaded in this process
_loading: list[Origin] = []  # the plugins being loaded now (innermost last): what `register` records
_entry_points_done = False


def current_origin() -> Origin | None:
    """The plugin whose code is running now (None outside a plugin load)."""
    return _loading[-1] if _loading else None


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def canonical(spec: str) -> str:
    """A spec as it is recorded: a file by its absolute path (a run names it from any working
    folder), a module as given."""
    spec = spec.strip()
    if not is_file_spec(spec):
        return spec
    try:
        return str(Path(spec).expanduser().resolve())
    except (OSError, ValueError, RuntimeError):  # a NUL byte, an unknown ~user: load_plugin says so
        return spec


def is_loaded(spec: str) -> bool:
    """Whether a plugin was loaded in this process, or (a module) imported by other code."""
    spec = canonical(spec)
    return spec in _loaded or (not is_file_spec(spec) and ":" not in spec and spec in sys.modules)


@contextmanager
def _registering(origin: Origin) -> Iterator[None]:
    _loading.append(origin)
    try:
        yield
    finally:
        _loading.pop()


def _failed(what: str, e: BaseException) -> PluginError:
    detail = " ".join(str(e).split()) or type(e).__name__
    return PluginError(f"{what} failed to load: {type(e).__name__}: {detail[:300]}")


def load_plugin(spec: str) -> Origin:
    """Load one plugin (a module, `module:callable` or a .py file) unless it is loaded already."""
    key = canonical(spec)
    if not key:
        raise PluginError("a plugin name is empty: give a module name or a .py file")
    if key in _loaded:
        return _loaded[key]
    origin = Origin(key)
    if is_file_spec(key):
        _load_file(Path(key), spec, origin)
    elif _MODULE_SPEC.fullmatch(key):
        _load_module(key, origin)
    else:
        raise PluginError(f"plugin {spec!r} is neither a module name (pkg.rules, pkg.rules:register) nor a .py file")
    _loaded[key] = origin
    return origin


def _load_module(spec: str, origin: Origin) -> None:
    module, _, attr = spec.partition(":")
    with _registering(origin):
        try:
            obj = importlib.import_module(module)
            for part in attr.split(".") if attr else ():
                obj = getattr(obj, part)
            if attr and callable(obj):
                obj()
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):  # the plugin itself, not something it imports
                raise PluginError(f"plugin {spec!r} cannot be imported: no module named {e.name!r} on sys.path "
                                  "(install it, add its folder to PYTHONPATH, or give the path of its .py file)") from None
            raise _failed(f"plugin {spec!r}", e) from None
        except PluginError:
            raise
        except Exception as e:  # whatever the plugin's own code raises
            raise _failed(f"plugin {spec!r}", e) from None


def _load_file(path: Path, given: str, origin: Origin) -> None:
    try:
        found, exists = path.is_file(), path.exists()
    except (OSError, ValueError):
        found = exists = False
    if not found:
        raise PluginError(f"plugin file not found: {given!r}" if not exists else f"plugin {given!r} is not a file")
    # a name of its own per path: two plugin files called rules.py do not replace each other
    name = f"rltok_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"plugin {given} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    with _registering(origin):
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise _failed(f"plugin {given}", e) from None


def load_plugins(specs) -> list[Origin]:
    return [load_plugin(s) for s in specs]


def load_entry_points() -> None:
    """Load every installed plugin (the entry points of group rltok.plugins), once per process."""
    global _entry_points_done
    if _entry_points_done:
        return
    _entry_points_done = True  # first: a plugin that asks a registry for a name does not recurse
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.value, ep.name)):
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
        if ep.value in _loaded:
            continue
        origin = Origin(ep.value, dist)
        with _registering(origin):
            try:
                obj = ep.load()
                if ep.attr and callable(obj):
                    obj()
            except Exception as e:
                raise _failed(f"plugin {ep.value!r} (entry point {ep.name!r} of {dist or 'an installed package'})",
                              e) from None
        _loaded[ep.value] = origin


def distribution_of(module: str) -> str | None:
    """The installed distribution that provides a top-level module, if one does."""
    names = _packages_distributions().get(module.partition(":")[0].split(".")[0], [])
    return names[0] if names else None


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()  # reads every installed distribution's file list: once
