"""``get_gfx`` as aiter answers it: from ``GPU_ARCHS`` (last entry) before the device."""

import os

from aiter import _fake


def get_gfx() -> str:
    archs = os.environ.get("GPU_ARCHS", "").strip()
    if archs and archs != "native":
        return archs.split(";")[-1].strip()
    return _fake.DEVICE_ARCH
