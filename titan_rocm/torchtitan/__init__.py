"""``titan_rocm.torchtitan``, the path users type.

The package moved to ``titan_rocm.adapters.tt030``; its names are here, and each of its
modules is a shim beside this file.
"""

import importlib

_module = importlib.import_module("titan_rocm.adapters.tt030")
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
__doc__ = _module.__doc__
if hasattr(_module, "__all__"):
    __all__ = list(_module.__all__)
