"""``is_flydsl_available`` as aiter answers it (``aiter/ops/flydsl/utils.py``, e4048607): the
``flydsl`` package is installed and ships kernels for the device's arch. The fake answers
``fake_aiter_support.FLYDSL_AVAILABLE`` (True unless a test says otherwise)."""

import fake_aiter_support


def is_flydsl_available() -> bool:
    return fake_aiter_support.FLYDSL_AVAILABLE
