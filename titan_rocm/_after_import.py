"""Run a callback right after a given module is first imported (a one-shot import hook), for
parts that must act on a module they must not import themselves (TorchTitan, ``triton`` in
compile workers, ``aiter.ops.mha``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Wraps the real loader of ``module_name`` and calls ``callback`` once its body has run, then
    leaves ``sys.meta_path``."""

    def __init__(self, module_name: str, callback: Callable[[ModuleType], None]) -> None:
        self.module_name = module_name
        self.callback = callback
        self._inner: Any = None

    def find_spec(self, fullname, path, target=None):  # noqa: D102 - importlib protocol
        if fullname != self.module_name:
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
        self.remove()
        self.callback(module)

    @property
    def waiting(self) -> bool:
        return self in sys.meta_path

    def arm(self) -> bool:
        """Call back now if the module is already imported (True), else wait for it (False)."""
        module = sys.modules.get(self.module_name)
        if module is not None:
            self.callback(module)
            return True
        if not self.waiting:
            sys.meta_path.insert(0, self)
        return False

    def remove(self) -> None:
        """Stop waiting (no-op when not waiting)."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
