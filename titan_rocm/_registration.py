"""``titan_rocm._registration``, the path users type.

The module moved to ``titan_rocm.adapters.tt022.registration``; this name is that module
itself (one module object, whichever path imports it).
"""

import importlib
import sys

_module = importlib.import_module("titan_rocm.adapters.tt022.registration")
sys.modules[__name__] = _module
