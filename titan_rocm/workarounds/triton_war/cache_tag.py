"""Keep torch.compile's caches from serving binaries built before the wrapper existed.

Inductor's FX graph cache (and the AOTAutograd / autotune caches) can return compiled
graphs whose Triton binaries are loaded without calling ``triton.compile``, so the wrapper
would never see them. Every one of those caches mixes ``torch.compiler.config.cache_key_tag``
into its key. :func:`apply` appends titan-rocm's versioned tag to it (keeping whatever tag
the user set) and exports ``TORCH_COMPILE_CACHE_KEY_TAG`` for child processes: torch reads
that variable only when ``torch.compiler.config`` is first imported, which has long
happened in the trainer, so the config must be set directly there.

Both are settings of :mod:`titan_rocm.patches`: the job's teardown puts back the user's tag.

The tag names the rule because the rule changes which binaries are produced; bump
:data:`VERSION` whenever the wrapper's output for the same input changes.
"""

from __future__ import annotations

import os

from titan_rocm import patches

CACHE_KEY_TAG_ENV = "TORCH_COMPILE_CACHE_KEY_TAG"
"""torch's variable for the tag, read in child processes when their torch.compiler.config loads."""
VERSION = 1
PREFIX = "titan-rocm-triton-war"
SEPARATOR = "+"
BY = "triton_war cache tag"
"""Who makes the settings :func:`apply` makes (:mod:`titan_rocm.patches`)."""


def tag_for(rule: str) -> str:
    """titan-rocm's tag for ``rule``, e.g. ``titan-rocm-triton-war-v1-precise``."""
    return f"{PREFIX}-v{VERSION}-{rule}"


def combine(user_tag: str, rule: str) -> str:
    """``user_tag`` with titan-rocm's tag for ``rule`` appended; an older titan-rocm tag
    already in it is replaced, so applying twice (or with another rule) does not pile up."""
    ours = tag_for(rule)
    parts = [p for p in user_tag.split(SEPARATOR) if p and not p.startswith(PREFIX + "-")]
    return SEPARATOR.join([*parts, ours])


def apply(rule: str) -> str:
    """Set ``torch.compiler.config.cache_key_tag`` and ``$TORCH_COMPILE_CACHE_KEY_TAG`` to
    the combined tag; returns it.

    Raises:
        RuntimeError: this torch has no ``cache_key_tag`` (torch older than 2.6): cached
            graphs could bypass the wrapper; say which setting avoids that.
    """
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
