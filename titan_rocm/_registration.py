"""Register titan-rocm's converters with TorchTitan, now or as soon as TorchTitan loads.

TorchTitan costs seconds to import. ``import titan_rocm`` must not pay that in processes
that never train (Inductor compile workers, ``titan-rocm scan``), yet it must register the
converters whenever TorchTitan is, or will be, present. So: register at once if TorchTitan's
converter registry is already imported, else install a one-shot import hook that registers
right after that module executes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType

_TRIGGER = "torchtitan.protocols.model_converter"
_lock = threading.RLock()  # re-entered when importing the converters fires the hook
_registered = False


def register_converters() -> None:
    """Register every ``rocm*`` converter with TorchTitan's registry (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        partial = sys.modules.get("titan_rocm.converters")
        if partial is not None and not hasattr(partial, "register_all"):
            # titan_rocm.converters is being imported (it imports TorchTitan, which fired
            # the hook); it registers itself once its body has run.
            return
        from titan_rocm.converters import register_all

        register_all()
        _registered = True


class _RegisterAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds nothing itself; wraps the real loader of ``_TRIGGER`` to register afterwards."""

    def find_spec(self, fullname, path, target=None):  # noqa: D102 - importlib protocol
        if fullname != _TRIGGER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                self._inner = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _remove_hook()
        register_converters()


_hook = _RegisterAfterImport()


def _remove_hook() -> None:
    try:
        sys.meta_path.remove(_hook)
    except ValueError:
        pass


def register_when_torchtitan_loads() -> None:
    """Register now if TorchTitan's converter registry is loaded, else when it loads."""
    if _TRIGGER in sys.modules:
        register_converters()
    elif _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
