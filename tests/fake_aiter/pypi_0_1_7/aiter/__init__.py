"""Fake aiter, PyPI amd-aiter 0.1.7.post2.dev18 generation (see tests/fake_aiter/README.md)."""

import logging

logger = logging.getLogger("aiter")

from ._version import __version__  # noqa: E402,F401
from .ops.mha import *  # noqa: E402,F401,F403  (as the real aiter/__init__.py does)
