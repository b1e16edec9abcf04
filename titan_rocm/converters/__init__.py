"""TorchTitan converters: ``rocm`` (every workaround) and ``rocm.<workaround>`` (one each)."""

from __future__ import annotations

from torchtitan.protocols.model_converter import (
    _registry_model_converter_cls,
    register_model_converter,
)

from titan_rocm.converters.base import RocmConverter
from titan_rocm.workarounds import WORKAROUNDS

UMBRELLA = "rocm"


def converter_classes() -> dict[str, type[RocmConverter]]:
    """Every titan-rocm converter class by its registered name."""
    classes: dict[str, type[RocmConverter]] = {
        UMBRELLA: type(
            "RocmUmbrellaConverter",
            (RocmConverter,),
            {
                "converter_name": UMBRELLA,
                "workaround_names": tuple(WORKAROUNDS),
                "__doc__": "Applies every titan-rocm workaround whose gate holds.",
            },
        )
    }
    for name in WORKAROUNDS:
        converter = f"{UMBRELLA}.{name}"
        classes[converter] = type(
            f"Rocm_{name}_Converter",
            (RocmConverter,),
            {
                "converter_name": converter,
                "workaround_names": (name,),
                "__doc__": f"Applies the titan-rocm workaround {name!r} alone.",
            },
        )
    return classes


def register_all() -> None:
    """Register the converters with TorchTitan (names already taken are left as they are)."""
    for name, cls in converter_classes().items():
        if name not in _registry_model_converter_cls:
            register_model_converter(cls, name)


# Importing this module means TorchTitan is loaded: register now (idempotent).
from titan_rocm._registration import register_converters  # noqa: E402

register_converters()
