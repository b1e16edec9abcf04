"""GPU-bound TorchTitan 0.3.0 configs for ``benchmarks/tt030_validation.py`` (``--module``).

The debug models are host-bound on an H200 (a 1 % ratio drowns in launch noise), so the
throughput runs use these, as the 0.2.2 validation used ``benchmarks/bench_flavors.py``:

- ``llama3_1b``: TorchTitan 0.3.0's own ``1B`` llama3 flavor in the debug config's job;
- ``deepseek_v3_4b``: the ``16B`` flavor cut to 6 blocks (1 dense, 5 MoE with 64 experts,
  dim 2048; about 3.5 B parameters), one GPU.

``<name>_rocm`` is ``rocm(<name>())``: the same job with titan-rocm (module ``__getattr__``).
"""

from __future__ import annotations

from typing import Any


def _with_model(config: Any, spec: Any) -> Any:
    from torchtitan.models.common.config_utils import decoder_vocab_size

    config.model_spec = spec
    inner = getattr(config.loss, "loss_fn", config.loss)
    if hasattr(inner, "global_vocab_size"):
        inner.global_vocab_size = decoder_vocab_size(spec)
    return config


def llama3_1b() -> Any:
    """llama3 debug job with the ``1B`` flavor."""
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    return _with_model(llama3_debugmodel(), model_registry("1B"))


def deepseek_v3_4b() -> Any:
    """deepseek_v3 debug job with the ``16B`` flavor cut to its first 6 blocks."""
    from torchtitan.models.deepseek_v3 import model_registry
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    spec = model_registry("16B")
    spec.model.layers = spec.model.layers[:6]
    return _with_model(deepseek_v3_debugmodel(), spec)


def __getattr__(name: str) -> Any:
    if name.endswith("_rocm") and name[: -len("_rocm")] in ("llama3_1b", "deepseek_v3_4b"):
        base = globals()[name[: -len("_rocm")]]

        def config() -> Any:
            from titan_rocm.adapters.tt030 import rocm

            return rocm(base())

        config.__name__ = name
        return config
    raise AttributeError(name)
