"""titan-rocm: TorchTitan 0.2.2 converters that make compiled training correct on AMD ROCm.

``import titan_rocm`` registers the converters ``rocm`` and ``rocm.*``; if TorchTitan is not
imported yet, registration waits until it is, so tools and Inductor compile workers never
load it."""

from titan_rocm.adapters.tt022.registration import (
    register_converters,
    register_when_torchtitan_loads,
)

__version__ = "0.1.0"

__all__ = ["__version__", "register_converters"]

register_when_torchtitan_loads()
