"""Register titan-rocm's converters with TorchTitan 0.2.2, now or as soon as TorchTitan loads.

TorchTitan costs seconds to import. ``import titan_rocm`` must not pay that in processes
that never train (Inductor compile workers, ``titan-rocm scan``), yet it must register the
converters whenever TorchTitan is, or will be, present. So: register at once if TorchTitan's
converter registry is already imported, else install a one-shot import hook that registers
right after that module executes.
"""

from __future__ import annotations

import threading

from titan_rocm._after_import import AfterImport

_TRIGGER = "torchtitan.protocols.model_converter"
_lock = threading.RLock()  # register_all may import TorchTitan, which fires the hook
_registered = False


def register_converters() -> None:
    """Register every ``rocm*`` converter with TorchTitan's registry (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        from titan_rocm.converters import register_all

        register_all()
        _registered = True


_hook = AfterImport(_TRIGGER, lambda _module: register_converters())


def register_when_torchtitan_loads() -> None:
    """Register now if TorchTitan's converter registry is loaded, else when it loads."""
    _hook.arm()
