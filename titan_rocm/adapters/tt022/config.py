"""TorchTitan 0.2.2's ``[rocm]`` section and ``--rocm.<field>`` flags.

TorchTitan 0.2.2 extends its ``JobConfig`` through ``job.custom_config_module``: set
``[job] custom_config_module = "titan_rocm.config"`` in the TOML (or
``--job.custom_config_module titan_rocm.config``) and ``ConfigManager`` merges the
:class:`JobConfig` below, so ``[rocm]`` keys and ``--rocm.*`` flags parse together
(CLI over TOML over defaults). ``--experimental.custom_args_module`` does NOT work for
this in 0.2.2: it is copied to ``job.custom_config_module`` only after parsing.

The settings themselves are version-neutral: :mod:`titan_rocm.settings`. A job that never
mentions ``[rocm]`` gets their defaults (:func:`settings_from`).
"""

from dataclasses import dataclass, field
from typing import Any

from titan_rocm.settings import RocmSettings, coerce

CONFIG_MODULE = "titan_rocm.config"

__all__ = ["CONFIG_MODULE", "JobConfig", "RocmSettings", "settings_from"]


@dataclass
class JobConfig:
    """TorchTitan JobConfig extension merged by ``ConfigManager`` (``job.custom_config_module``)."""

    rocm: RocmSettings = field(default_factory=RocmSettings)


def settings_from(job_config: Any) -> RocmSettings:
    """The ``[rocm]`` settings of a (possibly not extended) TorchTitan 0.2.2 job config.

    A job config parsed without ``titan_rocm.config`` has no ``rocm`` attribute: defaults.

    Raises:
        ValueError: a value is not accepted (naming it and the accepted values).
    """
    return coerce(getattr(job_config, "rocm", None))
