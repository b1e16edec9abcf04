"""The Triton compile wrapper, end to end on real HIP cross-compiles (gfx942, on this CPU).

Triton 3.9 rarely emits the real hazard any more, so the "hazardous" cases scan real
kernels with a custom rule plugged into the real scanner (``EveryBufferStore`` below, via
``scan_text(..., rule=<Rule>)``): it flags every MUBUF store of more than 64 bits. That
stands in for a precise-rule hit; everything after the scan (recompile, cache keys,
rescan, stats) is the production path. Clean cases use the real precise rule.
"""

from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")

from tests.support.triton_war_hook_kernels import (  # noqa: E402
    GFX942,
    OPTIONS,
    compile_gfx942,
    source,
    stores,
)
from titan_rocm.scanner.amdgcn import Program  # noqa: E402
from titan_rocm.scanner.hazards import (  # noqa: E402
    Finding,
    Rule,
    RuleResult,
    store_site,
)
from titan_rocm.scanner.scan import scan_text  # noqa: E402
from titan_rocm.workarounds.triton_war import buffer_ops, compile_hook, compile_lock, stats  # noqa: E402


class EveryBufferStore(Rule):
    """Custom rule for tests: every MUBUF store of more than 64 bits is 'hazardous'."""

    name = "every-buffer-store"

    def check(self, program: Program, arch: str | None = None) -> RuleResult:
        result = RuleResult()
        for ins in program.instructions:
            site = store_site(ins)
            if site is not None and site.kind == "buffer" and site.data_dwords > 2:
                result.stores_checked += 1
                block = program.block_of[ins.index]
                result.findings.append(Finding(ins, ins, 0, 1, (block,)))
        return result


EVERY_BUFFER_STORE = EveryBufferStore()


def flag_buffer_stores(text: str, arch: str | None, rule: str):
    return scan_text(text, arch=arch, rule=EVERY_BUFFER_STORE)


def flag_everything(text: str, arch: str | None, rule: str):
    """Still 'hazardous' after the recompile: forces the residual path."""
    return SimpleNamespace(hazardous=True, hazards=[])


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A private Triton cache, buffer ops at Triton's default, no stats dir, no wrapper."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, unwarned
    monkeypatch.delenv("AMDGCN_USE_BUFFER_OPS", raising=False)
    monkeypatch.delenv(stats.ENV_STATS_DIR, raising=False)
    compile_hook.uninstall()
    stats.reset_local()
    yield tmp_path / "triton-cache"
    compile_hook.uninstall()
    stats.reset_local()


def cache_entries(cache_dir) -> dict[str, str]:
    """{cache key directory: amdgcn text} of every compiled kernel in the cache."""
    out = {}
    for path in cache_dir.rglob("*.amdgcn"):
        out[path.parent.name] = path.read_text()
    return out


def test_install_binds_every_lookup_site_and_is_idempotent():
    import triton.compiler
    import triton.compiler.compiler as cc

    original = cc.compile
    hook = compile_hook.install()
    assert triton.compile is hook.wrapper
    assert triton.compiler.compile is hook.wrapper
    assert cc.compile is hook.wrapper
    again = compile_hook.install(rule="conservative", strict=True)
    assert again is hook and hook.original is original
    assert hook.config.rule == "conservative" and hook.config.strict
    compile_hook.uninstall()
    assert triton.compile is original and cc.compile is original


def test_install_rebinds_jit_functions_that_already_launched():
    """A @triton.jit function copies ``compile`` into ``fn.compile`` at its first launch
    (create_binder); one launched before install must still go through the wrapper."""
    import triton.compiler.compiler as cc

    from tests.support.triton_war_hook_kernels import silu_mul_kernel

    original = cc.compile
    silu_mul_kernel.compile = original  # what create_binder did at the first launch
    try:
        hook = compile_hook.install()
        assert silu_mul_kernel.compile is hook.wrapper
        compile_hook.uninstall()
        assert silu_mul_kernel.compile is original
    finally:
        del silu_mul_kernel.compile


def test_install_rejects_unknown_rule():
    with pytest.raises(ValueError, match="'sloppy'.*precise, conservative"):
        compile_hook.install(rule="sloppy")


def test_clean_kernel_is_untouched(isolated, monkeypatch):
    plain = compile_gfx942()
    hook = compile_hook.install()  # the real precise rule

    def no_recompile(*args, **kwargs):
        raise AssertionError("a clean kernel must not be recompiled")

    monkeypatch.setattr(hook, "recompile", no_recompile)
    wrapped = compile_gfx942()
    assert wrapped.hash == plain.hash
    assert wrapped.asm["hsaco"] == plain.asm["hsaco"]
    assert "buffer_store_dwordx4" in stores(wrapped)
    local = stats.local()
    assert (local.scanned, local.hazardous, local.patched, local.residual) == (1, 0, 0, 0)


def test_hazardous_kernel_is_recompiled_without_buffer_stores(isolated, monkeypatch):
    from triton import knobs

    monkeypatch.setattr(knobs, "propagate_env", False)  # the wrapper must force it on
    compile_hook.install(scanner=flag_buffer_stores)
    kernel = compile_gfx942()
    assert "buffer_store_dwordx4" not in stores(kernel)
    assert "global_store_dwordx4" in stores(kernel)
    assert scan_text(kernel.asm["amdgcn"], rule=EVERY_BUFFER_STORE).hazardous is False
    # The flip is undone: knob, environment, propagate_env.
    assert knobs.amd.use_buffer_ops is True
    assert "AMDGCN_USE_BUFFER_OPS" not in os.environ
    assert knobs.propagate_env is False
    local = stats.local()
    assert (local.scanned, local.hazardous, local.patched, local.residual) == (1, 1, 1, 0)
    assert local.names["patched"] == ["scale_kernel"]


def test_recompile_with_positional_arguments(isolated):
    """Inductor calls ``triton.compile(*compile_args, **compile_kwargs)``."""
    compile_hook.install(scanner=flag_buffer_stores)
    kernel = triton.compile(source(), GFX942, dict(OPTIONS))
    assert "global_store_dwordx4" in stores(kernel)
    assert stats.local().patched == 1


def test_two_variants_under_two_cache_keys_and_second_compile_hits(isolated):
    from triton import knobs

    compile_hook.install(scanner=flag_buffer_stores)
    first = compile_gfx942()
    entries = cache_entries(isolated)
    assert len(entries) == 2
    on = [k for k, text in entries.items() if "buffer_store_dwordx4" in text]
    off = [k for k, text in entries.items() if "buffer_store_dwordx4" not in text]
    # No poisoning: the buffer-ops key holds the buffer-store binary, the other key the rest.
    assert len(on) == 1 and len(off) == 1
    assert first.asm["amdgcn"] == entries[off[0]]
    assert "global_store_dwordx4" in entries[off[0]]

    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    try:
        second = compile_gfx942()
    finally:
        knobs.compilation.listener = None
    assert hits == [True, True]  # the original, then its buffer-ops-off variant
    assert second.hash == first.hash
    assert len(cache_entries(isolated)) == 2


def test_without_env_propagation_the_recompile_would_be_a_cache_hit(isolated):
    """Why propagate_env matters: knob off but env untouched -> same key, hazardous binary."""
    from triton import knobs

    plain = compile_gfx942()
    saved = knobs.propagate_env
    knobs.propagate_env = False
    try:
        with knobs.amd.scope():
            knobs.amd.use_buffer_ops = False
            again = triton.compile(source(), target=GFX942, options=dict(OPTIONS))
    finally:
        knobs.propagate_env = saved
    assert again.hash == plain.hash
    assert "buffer_store_dwordx4" in stores(again)


def test_residual_keeps_original_logs_and_counts(isolated, caplog):
    plain = compile_gfx942()
    compile_hook.install(scanner=flag_everything)
    with caplog.at_level(logging.ERROR, logger="titan_rocm"):
        kernel = compile_gfx942()
    assert kernel.hash == plain.hash
    assert any("scale_kernel" in r.getMessage() and "keeps the buffer-store data hazard"
               in r.getMessage() for r in caplog.records)
    local = stats.local()
    assert (local.hazardous, local.patched, local.residual) == (1, 0, 1)
    assert local.names["residual"] == ["scale_kernel"]


def test_strict_raises_naming_the_kernel(isolated):
    compile_hook.install(scanner=flag_everything, strict=True)
    with pytest.raises(compile_hook.HazardousKernelError, match="scale_kernel"):
        compile_gfx942()


def test_failed_recompile_is_residual(isolated, monkeypatch, caplog):
    hook = compile_hook.install(scanner=flag_buffer_stores)

    def broken(*args, **kwargs):
        raise RuntimeError("LLVM fell over")

    monkeypatch.setattr(hook, "recompile", broken)
    with caplog.at_level(logging.ERROR, logger="titan_rocm"):
        kernel = compile_gfx942()
    assert "buffer_store_dwordx4" in stores(kernel)
    assert "LLVM fell over" in caplog.text
    assert stats.local().residual == 1


def test_recompiled_kernel_without_amdgcn_is_not_trusted(isolated, monkeypatch):
    hook = compile_hook.install(scanner=flag_buffer_stores)
    real_recompile = hook.recompile

    def recompile_losing_text(args, kwargs):
        fixed = real_recompile(args, kwargs)
        fixed.asm.pop("amdgcn")
        return fixed

    monkeypatch.setattr(hook, "recompile", recompile_losing_text)
    kernel = compile_gfx942()
    assert "buffer_store_dwordx4" in stores(kernel)  # the original, kept
    assert stats.local().residual == 1 and stats.local().patched == 0


def test_non_hip_kernels_are_skipped():
    hook = compile_hook.install(scanner=flag_everything)
    cuda = SimpleNamespace(name="k", hash="h", asm={},
                           metadata=SimpleNamespace(target=SimpleNamespace(backend="cuda")))
    assert hook.check(cuda, (), {}) is cuda
    assert stats.local().skipped_non_hip == 1 and stats.local().scanned == 0


def test_kernel_without_amdgcn_is_counted_unscanned(caplog):
    hook = compile_hook.install(scanner=flag_everything)
    hip = SimpleNamespace(name="k", hash="h", asm={"hsaco": b""},
                          metadata=SimpleNamespace(target=SimpleNamespace(backend="hip",
                                                                          arch="gfx942")))
    with caplog.at_level(logging.WARNING, logger="titan_rocm"):
        assert hook.check(hip, (), {}) is hip
    assert stats.local().unscanned == 1 and "not scanned" in caplog.text


def test_stale_env_vars_from_the_caller_are_recomputed(isolated):
    """The JIT's async path computes _env_vars before calling compile; computed during
    another thread's flip they say buffer ops off. The wrapper must not key an 'on'
    compile with them."""
    compile_hook.install()
    stale = {"AMDGCN_USE_BUFFER_OPS": "false"}
    kernel = triton.compile(source(), target=GFX942, options=dict(OPTIONS), _env_vars=stale)
    plain_key = compile_gfx942().hash
    assert kernel.hash == plain_key
    assert "buffer_store_dwordx4" in stores(kernel)


def test_the_knob_of_this_triton_and_the_bound_sites():
    hook = compile_hook.install()
    knob = hook.knob.to_dict()
    assert knob["env_var"] == "AMDGCN_USE_BUFFER_OPS"
    assert knob["knob"] == "triton.knobs.amd.use_buffer_ops"
    assert knob["default"] is True  # Triton 3.9 (3.6+): buffer ops on by default
    assert knob["in_cache_key"] is True
    assert all(compile_hook.bound_sites().values())


def test_knob_found_by_env_var_when_renamed():
    class Env:
        def __init__(self, key, default):
            self.key, self.default = key, default

    class AmdKnobs:
        enable_buffer_operations = Env("AMDGCN_USE_BUFFER_OPS", False)
        other = Env("SOMETHING_ELSE", True)

    attr, desc = buffer_ops._knob_descriptor(AmdKnobs())
    assert attr == "enable_buffer_operations" and desc.default is False


def test_env_only_flip_for_triton_without_knobs(monkeypatch):
    knob = buffer_ops.BufferOpsKnob("3.3.0", "AMDGCN_USE_BUFFER_OPS", None, None,
                                      None, None, True)
    monkeypatch.setenv("AMDGCN_USE_BUFFER_OPS", "1")
    with buffer_ops.buffer_ops_off(knob):
        assert os.environ["AMDGCN_USE_BUFFER_OPS"] == "0"
    assert os.environ["AMDGCN_USE_BUFFER_OPS"] == "1"


def test_concurrent_compiles_never_cross_contaminated(isolated):
    """Threads compile 'hazardous' (silu_mul) and clean (scale) kernels at once. A clean
    kernel compiled while another thread has buffer ops off would lose its buffer stores;
    a hazardous one compiled with them on would keep them."""

    def flag_silu(text, arch, rule):
        if "silu_mul_kernel" in text:
            return flag_buffer_stores(text, arch, rule)
        return scan_text(text, arch=arch, rule=rule)

    compile_hook.install(scanner=flag_silu)
    jobs = [(kind, 2048 * m) for m in (1, 2, 4) for kind in ("silu_mul", "scale")]
    results: dict[tuple[str, int], list[str]] = {}
    errors: list[BaseException] = []

    def run(kind: str, block: int) -> None:
        try:
            results[(kind, block)] = stores(compile_gfx942(kind, block))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for (kind, block), found in results.items():
        if kind == "silu_mul":
            assert not any(s.startswith("buffer_store") for s in found), (kind, block, found)
        else:
            assert "buffer_store_dwordx4" in found, (kind, block, found)
    assert "AMDGCN_USE_BUFFER_OPS" not in os.environ
    assert stats.local().patched == 3 and stats.local().scanned == 6


def test_compile_lock_writer_waits_for_readers_and_blocks_new_ones():
    lock = compile_lock.CompileLock()
    order: list[str] = []
    reader_in = threading.Event()
    release_reader = threading.Event()

    def reader():
        with lock.shared():
            order.append("reader-in")
            reader_in.set()
            release_reader.wait(5)
            order.append("reader-out")

    def writer():
        with lock.exclusive():
            order.append("writer")

    r = threading.Thread(target=reader)
    r.start()
    reader_in.wait(5)
    w = threading.Thread(target=writer)
    w.start()
    w.join(0.2)
    assert order == ["reader-in"]  # writer waits for the reader
    release_reader.set()
    r.join(5)
    w.join(5)
    assert order == ["reader-in", "reader-out", "writer"]


def test_compile_lock_exclusive_inside_shared_raises_instead_of_deadlocking():
    lock = compile_lock.CompileLock()
    with lock.shared(), pytest.raises(RuntimeError, match="deadlock"):
        with lock.exclusive():
            pass
