"""Fake aiter, aiter main at e4048607 (2026-08-22) generation (see tests/fake_aiter/README.md).

The ``main`` generation's package (``../../main/aiter``) is searched after this directory, so
every module but ``_version`` and ``_fake`` is main's; main's ``aiter.ops.mha`` leaves out what
ROCm/aiter merged after e4048607 when ``aiter._fake.CHOICE`` is ``e4048607``.
"""

import logging
from pathlib import Path

__path__.append(str(Path(__file__).resolve().parents[2] / "main" / "aiter"))

logger = logging.getLogger("aiter")

from ._version import __version__  # noqa: E402,F401
from .ops.mha import *  # noqa: E402,F401,F403  (as the real aiter/__init__.py does)
