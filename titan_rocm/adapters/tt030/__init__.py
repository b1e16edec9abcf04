"""titan-rocm for TorchTitan 0.3.0: a trainer adapter (0.2.2 uses the converters instead).

One line in a config function, ``return rocm(deepseek_v3_16b())``, or on the command line
with any stock config::

    python -m torchtitan.train --module titan_rocm.torchtitan.configs --config deepseek_v3_16b \\
        [--rocm.moe_eager_compile off]

Importing this package with another TorchTitan installed raises
:class:`~titan_rocm.torchtitan_version.TorchTitanVersionError` naming the entry point that
fits it. Docs: docs/torchtitan-0.3.md.
"""

from titan_rocm.torchtitan_version import require

require("0.3", "titan_rocm.torchtitan (the TorchTitan 0.3.0 adapter)")

from titan_rocm.adapters.tt030.trainer import (  # noqa: E402
    RocmTrainer,
    RocmTrainerMixin,
    rocm,
    rocm_trainer_class,
)
from titan_rocm.settings import RocmSettings  # noqa: E402

__all__ = ["RocmSettings", "RocmTrainer", "RocmTrainerMixin", "rocm", "rocm_trainer_class"]
