"""``titan_rocm.torchtitan``: the TorchTitan 0.3.0 paths users type (README.md,
docs/torchtitan-0.3.md): ``from titan_rocm.torchtitan import rocm``, ``--module
titan_rocm.torchtitan.configs``, ``--override.imports titan_rocm.torchtitan.override.rocm``.

Its names are those of :mod:`titan_rocm.adapters.tt030`, where the code lives; ``configs``
is that package's module under this path, and ``override`` is a real module of its own
(TorchTitan 0.3.0 keys an ``@override`` by its function's module).
"""

from titan_rocm.adapters.tt030 import (
    RocmSettings,
    RocmTrainer,
    RocmTrainerMixin,
    rocm,
    rocm_trainer_class,
)

__all__ = ["RocmSettings", "RocmTrainer", "RocmTrainerMixin", "rocm", "rocm_trainer_class"]
