"""Test controls of the fake aiter (shared by both generations): the pretend device arch and
the record of kernel calls."""

from fake_aiter_support import CALLS, names, record, reset  # noqa: F401

GENERATION = "0.1.7"
