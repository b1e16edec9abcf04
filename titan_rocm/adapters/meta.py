"""The job's model on the meta device, built as both TorchTitan generations' trainers build it
(``titan-rocm plan`` reads its module types and shapes; no memory is allocated)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def on_meta(build: Callable[[], T], dtype: str) -> T:
    """``build()`` under ``torch.device("meta")`` with the default dtype set to the job's
    ``training.dtype`` (a name of TorchTitan's ``TORCH_DTYPE_MAP``), as ``Trainer.__init__``
    builds the model in TorchTitan 0.2.2 and 0.3.0. Each adapter's ``build_meta_model`` finds
    the model its generation's way (0.2.2: train spec and flavor; 0.3.0: the config's
    ``model_spec``) and builds it here."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[dtype]):
        return build()
