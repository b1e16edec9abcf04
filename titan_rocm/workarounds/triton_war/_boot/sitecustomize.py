"""titan-rocm worker bootstrap, loaded as ``sitecustomize`` at interpreter start.

The ``rocm.triton_war`` converter puts this directory first on ``sys.path`` and
``PYTHONPATH`` of the training process, so every Python it starts (Inductor's compile
workers get the parent's ``sys.path`` as their ``PYTHONPATH``) imports this file at start-up.
It does nothing unless ``TITAN_ROCM_TRITON_WAR=1``; then it arranges for titan-rocm's Triton
compile wrapper to be installed as soon as ``triton`` is imported. It then runs the
``sitecustomize`` it shadows, if there is one, so that one keeps working.
"""

import os as _os
import sys as _sys


def _run_shadowed_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.realpath(__file__))
    rest = [p for p in _sys.path if _os.path.realpath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_run_shadowed_sitecustomize()

if _os.environ.get("TITAN_ROCM_TRITON_WAR") == "1":
    try:
        from titan_rocm.workarounds.triton_war import bootstrap as _bootstrap
    except ImportError:
        # A Python that does not have titan-rocm (another venv started by the trainer).
        _bootstrap = None
    if _bootstrap is not None:
        _bootstrap.boot()
