"""``python -m titan_rocm.train``: the module :mod:`titan_rocm.adapters.tt022.train` itself (one
module object, whichever path imports it)."""

import importlib
import sys

_module = importlib.import_module("titan_rocm.adapters.tt022.train")
if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
