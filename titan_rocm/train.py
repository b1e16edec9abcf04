"""``titan_rocm.train``, the path users type.

The module moved to ``titan_rocm.adapters.tt022.train``; this name is that module
itself (one module object, whichever path imports it).
"""

import importlib
import sys

_module = importlib.import_module("titan_rocm.adapters.tt022.train")
if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
