"""Fake aiter, aiter main generation: e4048607 (2026-08-22) and ROCm/aiter#4875 merged after it
(see tests/fake_aiter/README.md)."""

import logging

logger = logging.getLogger("aiter")

from ._version import __version__  # noqa: E402,F401
from .ops.mha import *  # noqa: E402,F401,F403  (as the real aiter/__init__.py does)
