"""The job's model on the meta device, built as both TorchTitan generations' trainers build it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def on_meta(build: Callable[[], T], dtype: str) -> T:
    """``build()`` under ``torch.device("meta")`` with the job's ``training.dtype`` as default
    dtype, as ``Trainer.__init__`` builds the model in TorchTitan 0.2.2 and 0.3.0."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[dtype]):
        return build()
