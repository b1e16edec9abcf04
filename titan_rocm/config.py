"""``titan_rocm.config``, the path users type (``custom_config_module``): the module
:mod:`titan_rocm.adapters.tt022.config` itself (one module object, whichever path imports it).
"""

import importlib
import sys

_module = importlib.import_module("titan_rocm.adapters.tt022.config")
sys.modules[__name__] = _module
