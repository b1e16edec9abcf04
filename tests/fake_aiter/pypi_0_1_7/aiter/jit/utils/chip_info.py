"""``get_gfx`` as aiter 0.1.7.post2 answers it: the last ``GPU_ARCHS`` entry, else rocminfo;
cached for the process (``aiter/jit/utils/chip_info.py``, ``functools.lru_cache``)."""

import functools

from fake_aiter_support import gfx_from_env


@functools.lru_cache(maxsize=1)
def get_gfx() -> str:
    return gfx_from_env()
