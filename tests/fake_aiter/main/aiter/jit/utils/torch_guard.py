"""aiter's ``torch_compile_guard``: ``(*args, **kwargs)`` wrappers over ``torch.ops.aiter``."""

from fake_aiter_support import torch_compile_guard  # noqa: F401
