"""titan_rocm.patches: install, remember, restore, scope, idempotence, stacks, introspection."""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from titan_rocm import patches


@pytest.fixture(autouse=True)
def _restored() -> Iterator[None]:
    yield
    patches.restore(by="test")
    patches.restore(by="other")


def _module() -> types.ModuleType:
    module = types.ModuleType("fake_library")

    def f(x: int) -> int:
        return x + 1

    module.f = f
    return module


def _plus(n: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs) + n

        return wrapper

    return make


def test_a_patch_remembers_the_original_and_restores_it() -> None:
    module = _module()
    stock = module.f
    p = patches.patch(module, "f", _plus(10), by="test")
    assert module.f is p.value and p.original is stock and module.f(1) == 12
    assert [q.where for q in patches.installed("test")] == ["fake_library.f"]
    p.restore()
    assert module.f is stock and patches.installed("test") == []


def test_a_second_patch_by_the_same_owner_is_the_first() -> None:
    module = _module()
    first = patches.patch(module, "f", _plus(10), by="test")
    again = patches.patch(module, "f", _plus(10), by="test")
    assert again is first and module.f(1) == 12  # never wrapped twice


def test_refresh_rebuilds_from_the_original_instead_of_wrapping() -> None:
    module = _module()
    stock = module.f
    patches.patch(module, "f", _plus(10), by="test")
    p = patches.patch(module, "f", _plus(100), by="test", refresh=True)
    assert module.f(1) == 102 and p.original is stock


def test_a_scope_restores_at_its_end_and_only_what_no_one_else_holds() -> None:
    module = _module()
    stock = module.f
    with patches.scope("job 1") as one:
        patches.patch(module, "f", _plus(10), by="test")
        with patches.scope("job 2"):
            patches.patch(module, "f", _plus(10), by="test")
            assert [s.label for s in patches.installed("test")[0].holders] == ["job 1", "job 2"]
        assert module.f is not stock  # job 1 still holds it
        assert one.patches and patches.installed("test")[0].to_dict()["held_by"] == ["job 1"]
    assert module.f is stock and patches.installed("test") == []


def test_an_instance_attribute_is_removed_not_set_to_the_class_method() -> None:
    class Trainer:
        def step(self) -> int:
            return 1

    trainer = Trainer()
    with patches.scope():
        patches.patch(trainer, "step", _plus(1), by="test")
        assert "step" in vars(trainer) and trainer.step() == 2
    assert "step" not in vars(trainer) and trainer.step() == 1


def test_an_inherited_method_patched_on_a_subclass_is_deleted_there() -> None:
    class Base:
        def go(self) -> int:
            return 1

    class Child(Base):
        pass

    p = patches.patch(Child, "go", _plus(1), by="test")
    assert Child().go() == 2
    p.restore()
    assert "go" not in vars(Child) and Child.go is Base.go


def test_a_namespace_dict_is_an_owner() -> None:
    namespace = {"__name__": "some.module", "g": len}
    p = patches.patch(namespace, "g", lambda original: max, by="test")
    assert namespace["g"] is max and p.where == "some.module.g"
    p.restore()
    assert namespace["g"] is len


def test_a_classmethod_descriptor_is_put_back_as_it_stood() -> None:
    class Cache:
        @classmethod
        def bench(cls) -> str:
            return cls.__name__

    raw = vars(Cache)["bench"]
    p = patches.patch(Cache, "bench", lambda bound: classmethod(lambda cls: "patched"),
                      by="test")
    assert Cache.bench() == "patched"
    p.restore()
    assert vars(Cache)["bench"] is raw and Cache.bench() == "Cache"


def test_stacked_patches_of_two_owners_restore_in_any_order() -> None:
    module = _module()
    stock = module.f
    inner = patches.patch(module, "f", _plus(10), by="test")
    patches.patch(module, "f", _plus(100), by="other")
    assert module.f(1) == 112
    inner.restore()  # the one below: the one above is rebuilt over the stock function
    assert module.f(1) == 102 and patches.original(module, "f") is stock
    assert patches.find(module, "f", "other").original is stock
    patches.restore(by="other")
    assert module.f is stock


def test_a_patch_someone_replaced_is_forgotten_not_restored() -> None:
    module = _module()
    p = patches.patch(module, "f", _plus(10), by="test")

    def theirs(x: int) -> int:
        return -x

    module.f = theirs
    assert patches.find(module, "f", "test") is None
    p.restore()
    assert module.f is theirs
    again = patches.patch(module, "f", _plus(10), by="test")
    assert again is not p and again.original is theirs


def test_a_missing_attribute_is_refused() -> None:
    with pytest.raises(AttributeError):
        patches.patch(_module(), "nope", _plus(1), by="test")
    with pytest.raises(AttributeError, match="'nope'"):
        patches.patch({"__name__": "m"}, "nope", _plus(1), by="test")


def test_a_deep_copy_of_a_holder_shares_its_scope() -> None:
    scope = patches.Scope("job")
    holder = {"scope": scope}
    assert copy.deepcopy(holder)["scope"] is scope


# -- settings: an environment variable, an option of torch's config modules, sys.path ---------

def test_an_environment_variable_is_set_and_put_back_or_removed() -> None:
    import os

    os.environ.pop("TITAN_ROCM_TEST_SETTING", None)
    os.environ["TITAN_ROCM_TEST_KEPT"] = "mine"
    try:
        with patches.scope("job"):
            patches.setting(os.environ, "TITAN_ROCM_TEST_SETTING", "1", by="test")
            patches.setting(os.environ, "TITAN_ROCM_TEST_KEPT", "ours", by="test")
            patches.setting(os.environ, "TITAN_ROCM_TEST_KEPT", "again", by="test")  # no layer
            assert os.environ["TITAN_ROCM_TEST_SETTING"] == "1"
            assert os.environ["TITAN_ROCM_TEST_KEPT"] == "again"
            assert {p.where for p in patches.installed(by="test")} == {
                "os.environ.TITAN_ROCM_TEST_SETTING", "os.environ.TITAN_ROCM_TEST_KEPT"}
        assert "TITAN_ROCM_TEST_SETTING" not in os.environ
        assert os.environ["TITAN_ROCM_TEST_KEPT"] == "mine"
        assert patches.installed(by="test") == []
    finally:
        os.environ.pop("TITAN_ROCM_TEST_KEPT", None)


@pytest.fixture
def never_set() -> Iterator[str]:
    """``emulate_precision_casts`` as a user who never set it has it (torch's own entry: an
    earlier test in the process may have assigned it, even its default), put back after."""
    import torch._inductor.config as inductor_config

    from tests.support.state_leaks import never_set as unset

    with unset(inductor_config, ["emulate_precision_casts"]):
        yield "emulate_precision_casts"


def test_an_inductor_option_the_user_never_set_is_left_unset(never_set: str) -> None:
    import torch._inductor.config as inductor_config

    name = never_set
    assert inductor_config._is_default(name)
    before = getattr(inductor_config, name)
    with patches.scope("job"):
        patches.setting(inductor_config, name, not before, by="test")
        assert getattr(inductor_config, name) is (not before)
        assert not inductor_config._is_default(name)
    assert getattr(inductor_config, name) is before
    assert inductor_config._is_default(name)  # as if never set: a user's False stays theirs


def test_an_option_the_user_set_gets_their_value_back() -> None:
    import torch.compiler.config as compiler_config

    saved = compiler_config.cache_key_tag
    compiler_config.cache_key_tag = "user-tag"
    try:
        with patches.scope("job"):
            patches.setting(compiler_config, "cache_key_tag", "user-tag+ours", by="test")
            assert compiler_config.cache_key_tag == "user-tag+ours"
        assert compiler_config.cache_key_tag == "user-tag"
    finally:
        compiler_config.cache_key_tag = saved


def test_an_unknown_option_of_a_config_module_is_refused() -> None:
    import torch._inductor.config as inductor_config

    with pytest.raises(AttributeError, match="no_such_option"):
        patches.setting(inductor_config, "no_such_option", 1, by="test")
    assert patches.installed(by="test") == []


def test_a_setting_someone_changed_since_is_theirs() -> None:
    import os

    os.environ.pop("TITAN_ROCM_TEST_SETTING", None)
    with patches.scope("job"):
        patches.setting(os.environ, "TITAN_ROCM_TEST_SETTING", "ours", by="test")
        os.environ["TITAN_ROCM_TEST_SETTING"] = "theirs"
    assert os.environ.pop("TITAN_ROCM_TEST_SETTING") == "theirs"
