"""``titan_rocm.torchtitan.configs``, the path users type (``--module``): the module
:mod:`titan_rocm.adapters.tt030.configs` itself (one module object, whichever path imports it).
"""

import importlib
import sys

_module = importlib.import_module("titan_rocm.adapters.tt030.configs")
sys.modules[__name__] = _module
