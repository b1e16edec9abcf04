"""``get_gfx`` as aiter main (e4048607) answers it: still the last ``GPU_ARCHS`` entry, else
rocminfo, cached; main adds ``get_gfx_runtime()`` (always rocminfo), which mha.py's dispatch
does not use (``aiter/jit/utils/chip_info.py``)."""

import functools

import fake_aiter_support
from fake_aiter_support import gfx_from_env


@functools.lru_cache(maxsize=1)
def get_gfx() -> str:
    return gfx_from_env()


@functools.lru_cache(maxsize=1)
def get_gfx_runtime() -> str:
    return fake_aiter_support.DEVICE_ARCH
