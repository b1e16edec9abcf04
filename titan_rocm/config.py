"""``titan_rocm.config``, the path users type.

The module moved to ``titan_rocm.adapters.tt022.config``; this name is that module
itself (one module object, whichever path imports it).
"""

import importlib
import sys

_module = importlib.import_module("titan_rocm.adapters.tt022.config")
sys.modules[__name__] = _module
