"""TorchTitan 0.2.2's adapter: the converters ``rocm`` and ``rocm.<name>``, and their
registration. Importing this package does not import TorchTitan; :func:`register_all` does."""

from __future__ import annotations

from titan_rocm.adapters.tt022.converters.converter import UMBRELLA, RocmConverter, workarounds_of
from titan_rocm.workarounds.registry import WORKAROUNDS

__all__ = ["UMBRELLA", "RocmConverter", "converter_classes", "register_all", "workarounds_of"]


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
    """Register the converters with TorchTitan 0.2.2 (names already taken are left as they are)."""
    from torchtitan.protocols.model_converter import (
        _registry_model_converter_cls,
        register_model_converter,
    )

    for name, cls in converter_classes().items():
        if name not in _registry_model_converter_cls:
            register_model_converter(cls, name)
