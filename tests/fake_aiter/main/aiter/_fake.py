"""Test controls of the fake aiter (shared by every generation): the pretend device arch and
the record of kernel calls; which aiter this generation is."""

from fake_aiter_support import CALLS, names, record, reset  # noqa: F401

GENERATION = "main"
"""aiter's Python API generation (``titan_rocm.platform.API_GENERATIONS``)."""
CHOICE = "main"
"""The ``--aiter`` choice this fake stands for (``titan_rocm.platform.SIMULATED_AITERS``)."""
