"""What installing the choices handlers changes in the process (Inductor's options, this
thread's handler, functorch's lazy backward, the selector hook) is held by the scope it is
installed in and put back when that scope lets go, as a job's teardown does
(rocm.gemm_lookup installs them inside its job). Read back from where each lives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch._inductor import virtualized
from torch._inductor.select_algorithm import AlgorithmSelectorCache

from tests.support.state_leaks import never_set
from titan_rocm import patches
from titan_rocm.tuned_gemms.choices import BY, GEMM_SETTINGS, ChoicesFactory, RecordingChoices

OPTIONS = ("inductor_choices_class", *GEMM_SETTINGS)
_ABSENT = object()


def _read() -> dict[str, Any]:
    return {
        **{name: getattr(inductor_config, name) for name in OPTIONS},
        **{f"{name} is default": inductor_config._is_default(name) for name in OPTIONS},
        "force_non_lazy_backward_lowering": functorch_config.force_non_lazy_backward_lowering,
        "this thread's handler": vars(virtualized.threadlocal).get(
            virtualized._choices._key, _ABSENT),
        "AlgorithmSelectorCache.__call__": vars(AlgorithmSelectorCache)["__call__"],
    }


@pytest.fixture
def options_never_set() -> Iterator[None]:
    """The options as a user who never set them has them (an earlier test may have assigned
    one its default, which torch marks as set)."""
    with never_set(inductor_config, OPTIONS):
        yield


def test_the_choices_handlers_leave_with_the_scope_they_were_installed_in(
        options_never_set: None) -> None:
    from titan_rocm.tuned_gemms.choices import install

    before = _read()
    factory = ChoicesFactory(lambda: RecordingChoices(lambda found: None))
    with patches.scope("job"):
        install(factory)
        install(factory)  # again: the same settings, no second layer
        during = _read()
        assert inductor_config.inductor_choices_class is factory
        assert isinstance(virtualized.V.choices, RecordingChoices)
        assert {k for k in before if during[k] != before[k]} >= {
            "inductor_choices_class", "this thread's handler",
            "AlgorithmSelectorCache.__call__", *(f"{n} is default" for n in OPTIONS)}
        assert len([p for p in patches.installed(by=BY)
                    if p.name == "inductor_choices_class"]) == 1
    assert _read() == before
    assert patches.installed(by=BY) == []
