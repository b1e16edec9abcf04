"""titan-rocm: TorchTitan 0.2.2 converters that make compiled training correct on AMD ROCm.

``import titan_rocm`` (what ``[experimental] custom_import = "titan_rocm"`` does) registers
the converters ``rocm`` and ``rocm.*`` with TorchTitan. The import stays cheap: if
TorchTitan is not imported yet, registration waits until it is
(:mod:`titan_rocm.adapters.tt022.registration`), so tools such as ``titan-rocm scan`` and
Inductor compile workers never load it.
"""

from titan_rocm.adapters.tt022.registration import (
    register_converters,
    register_when_torchtitan_loads,
)

__version__ = "0.1.0"

__all__ = ["__version__", "register_converters"]

register_when_torchtitan_loads()
