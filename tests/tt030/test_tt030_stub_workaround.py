"""A new workaround (tests/support/stub_workaround.py: its registry entry and its mode field,
nothing else) runs in a TorchTitan 0.3.0 job without a line of the adapter changed."""

from __future__ import annotations

from tests.support.stub_workaround import ENTRIES, registered
from titan_rocm.adapters.tt030.job import RocmJob


def test_a_0_3_job_runs_every_registered_workaround_the_stubs_too(monkeypatch):
    with registered(monkeypatch) as settings_class:
        assert RocmJob(settings_class()).names[-2:] == list(ENTRIES)
