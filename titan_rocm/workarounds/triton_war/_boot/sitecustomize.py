"""titan-rocm worker bootstrap, loaded as ``sitecustomize`` at interpreter start.

Compile workers import it from the trainer's ``sys.path``; with ``TITAN_ROCM_TRITON_WAR=1`` it
installs the wrapper once ``triton`` is imported, then runs the ``sitecustomize`` it shadows."""

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
