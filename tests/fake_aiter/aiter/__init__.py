"""Fake aiter for titan-rocm's CPU tests (see tests/fake_aiter/README.md)."""

import logging

logger = logging.getLogger("aiter")

from .ops.mha import *  # noqa: E402,F401,F403  (as the real aiter/__init__.py does)
