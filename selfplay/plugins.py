"""User plugins: a researcher's own module, imported before the run config is checked.

A plugin is ordinary Python that registers things by name — a reward scheme
(:func:`populora_env.register_reward_scheme`), an advantage estimator
(:func:`agents.advantages.register_advantage`), a loss aggregation mode, an evolution operator
(:func:`evolution.operators.register_operator`) or a prompt set (:func:`populora_env.register_prompt_set`) —
so that a preset or a flag can then name it. ``populora train --plugins my_scheme.py mypkg.rewards`` imports
each entry: a path ending in ``.py`` is loaded as a module from that file, anything else is imported by its
module name (it must be importable, e.g. installed or on ``PYTHONPATH``).

Paths are made absolute when the run starts and saved in its ``config.json``. ``--resume`` imports a run's plugins
only when its command line names them again (the command line refuses, naming them, otherwise): a run directory
may come from someone else, and what its ``config.json`` names is not what the user chose to run.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from selfplay import interrupt

__all__ = ["PluginError", "load_plugin", "load_plugins", "normalize_plugin"]


class PluginError(ImportError):
    """A plugin could not be imported; the message names it and the cause."""


def normalize_plugin(spec: str) -> str:
    """An absolute path for a ``.py`` plugin, the module name unchanged otherwise."""
    if spec.endswith(".py"):
        return str(Path(spec).expanduser().resolve())
    return spec


def _module_name(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"populora_plugin_{path.stem}_{digest}"


def _import_failure(spec: str, exc: BaseException) -> PluginError:
    """The error of a plugin whose import raised ``exc``; ``sys.exit(N)`` and ``KeyboardInterrupt`` inside a
    plugin's import are reported like any failure (the command exits 2), not passed on as the command's exit;
    the ``KeyboardInterrupt`` of a real Ctrl-C is re-raised (:mod:`selfplay.interrupt`)."""
    interrupt.reraise_if_interrupted(exc)
    if isinstance(exc, SystemExit):
        return PluginError(f"plugin {spec!r} exited with {exc.code if exc.code is not None else 0} while importing")
    if isinstance(exc, KeyboardInterrupt):
        return PluginError(f"plugin {spec!r} exited with KeyboardInterrupt while importing")
    return PluginError(f"plugin {spec!r} failed while importing: {type(exc).__name__}: {exc}")


def load_plugin(spec: str) -> ModuleType:
    """Import one plugin (a ``.py`` path or a module name); importing the same one twice is a no-op."""
    if spec.endswith(".py"):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plugin file {spec!r} not found")
        name = _module_name(path)
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise PluginError(f"cannot load plugin file {spec!r}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            del sys.modules[name]
            raise _import_failure(spec, exc) from exc
        return module
    try:
        return importlib.import_module(spec)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _import_failure(spec, exc) from exc
    except ModuleNotFoundError as exc:
        if exc.name and spec.startswith(exc.name):
            raise PluginError(f"plugin module {spec!r} not found (give an importable module name or a .py path)") \
                from exc
        raise PluginError(f"plugin {spec!r} failed while importing: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise PluginError(f"plugin {spec!r} failed while importing: {type(exc).__name__}: {exc}") from exc


def load_plugins(specs: Iterable[str]) -> list[ModuleType]:
    """Import every plugin in order."""
    return [load_plugin(s) for s in specs]
