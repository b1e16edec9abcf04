"""Register titan-rocm's converters with TorchTitan 0.2.2, now or as soon as TorchTitan loads.

``import titan_rocm`` must not pay TorchTitan's seconds of import in processes that never
train (Inductor compile workers, ``titan-rocm scan``), so a one-shot import hook registers
right after TorchTitan's converter registry executes."""

from __future__ import annotations

import threading

from titan_rocm import torchtitan_version
from titan_rocm._after_import import AfterImport

_TRIGGER = "torchtitan.protocols.model_converter"
_lock = threading.RLock()  # register_all may import TorchTitan, which fires the hook
_registered = False


def register_converters() -> None:
    """Register every ``rocm*`` converter (idempotent); TorchTitanVersionError on 0.3.0, which has
    no converter registry."""
    global _registered
    torchtitan_version.require("0.2", "titan_rocm.register_converters (the rocm converters)")
    with _lock:
        if _registered:
            return
        from titan_rocm.adapters.tt022.converters import register_all

        register_all()
        _registered = True


_hook = AfterImport(_TRIGGER, lambda _module: register_converters())


def register_when_torchtitan_loads() -> None:
    """Register now if TorchTitan's converter registry is loaded, else when it loads; idle unless
    the installed TorchTitan is 0.2.x (read from package metadata)."""
    if torchtitan_version.series() == "0.2":
        _hook.arm()
