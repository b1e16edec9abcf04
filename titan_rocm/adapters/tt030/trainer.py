"""``RocmTrainer``: TorchTitan 0.3.0's ``Trainer`` with titan-rocm, and ``rocm(cfg)``
(docs/torchtitan-0.3.md).

A ``Trainer.Config`` subclass with a ``rocm`` field is all the stock entry point needs: it
builds the config's trainer class and parses the command line against the config's class."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from torchtitan.trainer import Trainer

from titan_rocm.adapters.tt030.job import RocmJob
from titan_rocm.settings import RocmSettings, check_section, coerce


class RocmTrainerMixin:
    """titan-rocm at a TorchTitan 0.3.0 trainer's own methods (first in the bases); the model
    spec is copied, so the user's config is left as it was."""

    _rocm: RocmJob

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        job = RocmJob(coerce(getattr(config, "rocm", None)))
        self._rocm = job
        spec = config.model_spec
        if spec is not None:
            # Trainer.__init__ reads config.model_spec before anything else; a copy keeps the
            # wrapping to this trainer.
            config.model_spec = dataclasses.replace(
                spec,
                parallelize_fn=job.wrap_parallelize(spec.parallelize_fn),
                pipelining_fn=(job.wrap_pipelining(spec.pipelining_fn)
                               if spec.pipelining_fn is not None else None),
            )
            self._rocm_parallelize_fn = spec.parallelize_fn
        super().__init__(config, *args, **kwargs)
        job.attach(self)

    def init_distributed(self) -> Any:
        parallel_dims = super().init_distributed()  # type: ignore[misc]
        self._rocm.start(self.config, parallel_dims,  # type: ignore[attr-defined]
                         getattr(self, "_rocm_parallelize_fn", None))
        return parallel_dims

    def train_step(self, data_iterator: Any) -> Any:
        return self._rocm.train_step(super().train_step,  # type: ignore[misc]
                                     self.step, data_iterator)  # type: ignore[attr-defined]

    def forward_backward_step(self, *, input_dict: Any, labels: Any,
                              global_valid_tokens: Any) -> Any:
        def run() -> Any:
            return super(RocmTrainerMixin, self).forward_backward_step(  # type: ignore[misc]
                input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
            )

        loss = self._rocm.forward_backward(run, input_dict, labels, global_valid_tokens)
        self._rocm.after_forward_backward(loss, labels, global_valid_tokens)
        return loss

    def close(self) -> None:
        try:
            job = getattr(self, "_rocm", None)
            if job is not None:
                job.close()
        finally:
            super().close()  # type: ignore[misc]


@functools.cache
def rocm_trainer_class(base: type) -> type:
    """``base`` with titan-rocm and a ``Config`` that adds ``rocm: RocmSettings``; cached per
    ``base``."""
    if issubclass(base, RocmTrainerMixin):
        return base
    if not (isinstance(base, type) and issubclass(base, Trainer)):
        raise TypeError(f"rocm_trainer_class needs a TorchTitan Trainer class, got {base!r}")
    name = f"Rocm{base.__name__}"
    namespace = {
        "__annotations__": {"rocm": RocmSettings},
        "rocm": field(default_factory=RocmSettings),
        "__module__": __name__,
        "__qualname__": f"{name}.Config",
        "__doc__": f"{base.__qualname__}.Config with titan-rocm's settings (``--rocm.*``).",
    }
    config_class = dataclass(kw_only=True, slots=True)(type("Config", (base.Config,), namespace))
    return type(name, (RocmTrainerMixin, base), {
        "Config": config_class,
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"TorchTitan's {base.__qualname__} with titan-rocm's workarounds.",
    })


RocmTrainer = rocm_trainer_class(Trainer)


def rocm(config: Any, **settings: Any) -> Any:
    """``config`` (any TorchTitan 0.3.0 ``Trainer.Config``) as a config of that trainer with
    titan-rocm, ``settings`` changing titan-rocm's defaults; calling it again changes the
    settings.

    Raises ValueError for an unknown setting or value, TypeError for a config that is not
    0.3.0's."""
    owner = getattr(type(config), "_owner", None)
    if owner is None or not dataclasses.is_dataclass(config):
        raise TypeError(
            f"rocm() needs a TorchTitan 0.3.0 Trainer.Config, got {type(config).__qualname__}"
        )
    cls = rocm_trainer_class(owner)
    values = dataclasses.asdict(coerce(getattr(config, "rocm", None)))
    values.update(settings)
    merged = check_section(values)  # ValueError: unknown key or bad value, with what is accepted
    kept = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.init and f.name != "rocm"}
    return cls.Config(**kept, rocm=merged)
