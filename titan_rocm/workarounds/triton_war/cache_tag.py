"""Keep torch.compile's caches from serving binaries built before the wrapper existed: they load
Triton binaries without ``triton.compile``. Bump :data:`VERSION` whenever the wrapper's output for
the same input changes."""

from __future__ import annotations

import os

from titan_rocm import patches

CACHE_KEY_TAG_ENV = "TORCH_COMPILE_CACHE_KEY_TAG"
"""Read in child processes when their torch.compiler.config loads (long done in the trainer)."""
VERSION = 1
PREFIX = "titan-rocm-triton-war"
SEPARATOR = "+"
BY = "triton_war cache tag"
"""Who makes the settings :func:`apply` makes (:mod:`titan_rocm.patches`)."""


def tag_for(rule: str) -> str:
    """E.g. ``titan-rocm-triton-war-v1-precise``."""
    return f"{PREFIX}-v{VERSION}-{rule}"


def combine(user_tag: str, rule: str) -> str:
    """``user_tag`` with titan-rocm's tag appended, replacing an older one so it never piles up."""
    ours = tag_for(rule)
    parts = [p for p in user_tag.split(SEPARATOR) if p and not p.startswith(PREFIX + "-")]
    return SEPARATOR.join([*parts, ours])


def apply(rule: str) -> str:
    """Set the combined tag in torch's config and environment; return it.

    RuntimeError on torch older than 2.6 (no ``cache_key_tag``): cached graphs would bypass the
    wrapper."""
    import torch.compiler.config as compiler_config

    if not hasattr(compiler_config, "cache_key_tag"):
        raise RuntimeError(
            "torch.compiler.config.cache_key_tag does not exist in this torch: Inductor's "
            "caches cannot be keyed by the triton_war wrapper; disable them with "
            "TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0"
        )
    tag = combine(compiler_config.cache_key_tag or "", rule)
    patches.setting(compiler_config, "cache_key_tag", tag, by=BY)
    patches.setting(os.environ, CACHE_KEY_TAG_ENV, tag, by=BY)
    return tag
