"""``TITAN_ROCM_DEBUG_CORRUPT``: a fault injected into compiled code only, to prove detection.

Test hook, never active unless the variable is set. Format (docs/numerics-audit-fault.md)::

    TITAN_ROCM_DEBUG_CORRUPT="block=3,graph=backward,op=mul,index=0,fraction=0.03,seed=0"

An Inductor post-grad pass puts a call to the custom op ``titan_rocm::debug_corrupt`` after
the ``index``-th ``aten.<op>`` node (graph order, floating-point outputs only) of every
compiled ``graph`` (forward or backward) graph built after it is installed. The op is opaque
to Inductor; it copies its input and, only while block ``block`` runs that graph, replaces
``fraction`` of the copy's elements by their neighbour's value (finite and in range, as the
Triton buffer-store hazard leaves them). Eager code never reaches the op.

Why the decision is made at run time: TorchTitan compiles each TransformerBlock separately,
and with ``inline_inbuilt_nn_modules`` identical blocks share one compiled graph, so which
block a graph belongs to is not known when it compiles. At the model's first forward every
block (the outermost module at ``model.layers[key]``: a compile, FSDP or checkpoint wrapper)
gets a marking ``__call__`` (a subclass swapped in, as FSDP2 does): block ``key``'s forward
runs between its enter and leave; its backward runs from the gradient of its output
(a tensor hook) to the gradient of its input. The op hits at most once per pass of block
``block`` (the first graph of that block that reaches it).

Installed by :func:`install` from ``JobWorkarounds.apply_all``, the one place TorchTitan
0.2.2's converters and 0.3.0's ``RocmTrainer`` both pass through, before anything compiles.
One log line when active; one after the first forward and backward, and one at exit, saying
how often it hit (or why it never did).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import math
import os
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from titan_rocm.log import forget, log, log_once

ENV = "TITAN_ROCM_DEBUG_CORRUPT"
FORMAT = "block=K[,graph=backward|forward][,op=mul][,index=0][,fraction=0.03][,seed=0][,rank=R]"
"""The accepted format (brackets: optional, with their defaults)."""
EXAMPLE = "block=1,graph=backward,op=mul,index=0,fraction=0.03,seed=0"
GRAPHS = ("backward", "forward")
KEYS = ("block", "graph", "op", "index", "fraction", "seed", "rank")
INSTALLED_ATTR = "_titan_rocm_debug_corrupt"
"""Set in a model's ``__dict__`` once :func:`install` has hooked it."""
MARKED_ATTR = "_titan_rocm_corrupt_base"
"""On a marking subclass: the class it was made from."""

_INT = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.")
_OP = re.compile(r"[a-z_][a-z0-9_]*")


class CorruptSpecError(ValueError):
    """``TITAN_ROCM_DEBUG_CORRUPT`` is not accepted (the message names the bad part)."""


@dataclass(frozen=True)
class CorruptSpec:
    """What to corrupt: ``fraction`` of the output of the ``index``-th ``aten.<op>`` node of
    block ``block``'s compiled ``graph`` graph (on global rank ``rank`` only, if given)."""

    block: int
    graph: str = "backward"
    op: str = "mul"
    index: int = 0
    fraction: float = 0.03
    seed: int = 0
    rank: int | None = None

    @property
    def key(self) -> str:
        """The block's key in ``model.layers`` (TorchTitan names layers ``"0"``, ``"1"``, ...)."""
        return str(self.block)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields."""
        return dataclasses.asdict(self)

    def text(self) -> str:
        """The variable's value that parses back to this spec."""
        parts = [f"{k}={v}" for k, v in self.to_dict().items() if v is not None]
        return ",".join(parts)

    def describe(self) -> str:
        """One phrase: what is corrupted, where."""
        where = "" if self.rank is None else f" on rank {self.rank}"
        return (f"{100 * self.fraction:.4g} % of the output of aten.{self.op} #{self.index} "
                f"in block {self.block}'s compiled {self.graph} graph{where} (seed {self.seed})")


def _fail(text: str, detail: str) -> CorruptSpecError:
    return CorruptSpecError(
        f"{ENV}={text!r}: {detail}; accepted: {FORMAT} (e.g. {EXAMPLE})"
    )


def _aten_op_exists(name: str) -> bool:
    try:
        getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _value(text: str, key: str, value: str) -> Any:
    """One field's value, or the error naming it and what it accepts."""
    if key in ("block", "index", "seed", "rank"):
        if not _INT.fullmatch(value):
            raise _fail(text, f"{key}={value!r} is not accepted ({key} is an integer >= 0)")
        return int(value)
    if key == "graph":
        if value not in GRAPHS:
            raise _fail(text, f"graph={value!r} is not accepted (graph is backward or forward)")
        return value
    if key == "fraction":
        number = float(value) if _NUMBER.fullmatch(value) else math.nan
        if not 0.0 < number <= 1.0:
            raise _fail(text, f"fraction={value!r} is not accepted (a number in (0, 1], "
                              "e.g. 0.03 for 3 % of the node's elements)")
        return number
    if not _OP.fullmatch(value) or not _aten_op_exists(value):
        raise _fail(text, f"op={value!r} is not accepted (an ATen operator name as the "
                          "post-grad graph shows it: mul, add, mm, bmm, sigmoid, ...)")
    return value


def parse(text: str) -> CorruptSpec:
    """The spec ``text`` (the variable's value) describes.

    Raises:
        CorruptSpecError: one sentence naming the bad entry and the accepted format.
    """
    fields: dict[str, Any] = {}
    for entry in text.split(","):
        entry = entry.strip()
        key, sep, value = entry.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise _fail(text, f"entry {entry!r} is not key=value")
        if key not in KEYS:
            raise _fail(text, f"key {key!r} is not accepted (keys: {', '.join(KEYS)})")
        if key in fields:
            raise _fail(text, f"key {key!r} is given twice")
        fields[key] = _value(text, key, value)
    if "block" not in fields:
        raise _fail(text, "block=K is missing (the layer id of the block to corrupt)")
    return CorruptSpec(**fields)


def from_env(environ: Mapping[str, str] | None = None) -> CorruptSpec | None:
    """The spec of :data:`ENV`; None when it is unset or empty.

    Raises:
        CorruptSpecError: the value is not accepted.
    """
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    return parse(text) if text else None


@dataclass
class Hits:
    """What the fault did in this process."""

    graphs: int = 0
    """Compiled graphs of the asked kind the pass put the op into."""
    graphs_without_node: int = 0
    """Compiled graphs of the asked kind with no ``index``-th ``aten.<op>`` node."""
    calls: int = 0
    """Times compiled code ran the op (any block: the graph may be shared)."""
    hits: int = 0
    """Times it corrupted (block ``block``'s pass)."""
    elements: int = 0
    """Elements of the node's output, summed over hits."""
    replaced: int = 0
    """Elements overwritten by their neighbour, summed over hits."""
    changed: int = 0
    """Of those, elements whose value changed (a neighbour can hold the same value)."""

    def to_dict(self) -> dict[str, int]:
        """JSON-able fields."""
        return dataclasses.asdict(self)


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


class _Runtime:
    """The process-wide state the pass, the op and the block markers share."""

    def __init__(self) -> None:
        self.spec: CorruptSpec | None = None
        self.hits = Hits()
        self.forward_block: str | None = None
        self.backward_block: str | None = None
        self.window_hit = False
        """The op already hit in the current pass of the target block."""
        self.keys: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self.blocks_marked = 0
        self.reported: set[str] = set()

    # -- block windows (called from the marked blocks and their tensor hooks) -----------------
    def call_block(self, module: nn.Module, call: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        key = self.keys.get(module)
        if key is None or torch.compiler.is_compiling():
            return call(module, *args, **kwargs)
        outer = self.forward_block
        self.forward_block = key
        if self.spec is not None and key == self.spec.key:
            self.window_hit = False
        try:
            out = call(module, *args, **kwargs)
        finally:
            self.forward_block = outer
        if torch.is_grad_enabled():
            for t in _grad_tensors(out):
                t.register_hook(functools.partial(_backward_enters, key))
            for t in _grad_tensors((args, kwargs)):
                t.register_hook(functools.partial(_backward_leaves, key))
        return out

    def backward_enters(self, key: str) -> None:
        self.backward_block = key
        if self.spec is not None and key == self.spec.key:
            self.window_hit = False

    def backward_leaves(self, key: str) -> None:
        if self.backward_block == key:
            self.backward_block = None

    # -- the op ---------------------------------------------------------------------------------
    def run(self, x: torch.Tensor, backward: bool) -> torch.Tensor:
        self.hits.calls += 1
        spec = self.spec
        block = self.backward_block if backward else self.forward_block
        if (spec is None or self.window_hit or block != spec.key
                or (spec.rank is not None and _rank() != spec.rank)):
            return x.clone()
        self.window_hit = True
        work = x.reshape(-1).clone()
        n = work.numel()
        replaced = changed = 0
        if n > 1:
            replaced = max(1, round(spec.fraction * n))
            g = torch.Generator(device=work.device)
            g.manual_seed(spec.seed * 1_000_003 + self.hits.hits)
            idx = torch.randperm(n, generator=g, device=work.device)[:replaced]
            before = work[idx]
            work[idx] = work[(idx + 1) % n]  # the right-hand side is read before the write
            changed = int((work[idx] != before).sum().item())
        self.hits.hits += 1
        self.hits.elements += n
        self.hits.replaced += replaced
        self.hits.changed += changed
        out = torch.empty_like(x)
        out.copy_(work.view(x.shape))
        return out

    # -- reporting ------------------------------------------------------------------------------
    def report(self, when: str) -> str | None:
        """Log how often the fault hit (or why it never did), once per ``when``."""
        spec = self.spec
        if spec is None or when in self.reported:
            return None
        self.reported.add(when)
        h = self.hits
        if h.hits:
            line = (f"titan-rocm: {ENV} {when}: corrupted block {spec.block}'s compiled "
                    f"{spec.graph} {h.hits} time(s), {h.changed} of {h.elements} elements "
                    f"changed ({100.0 * h.changed / max(h.elements, 1):.2f} %); the op is in "
                    f"{h.graphs} compiled graph(s) built here, ran {h.calls} time(s)")
        else:
            line = f"titan-rocm: {ENV} {when}: never matched: {self.why_not()}"
        log.warning("%s", line)
        return line

    def why_not(self) -> str:
        spec = self.spec
        assert spec is not None
        h = self.hits
        if h.calls:
            rank = "" if spec.rank is None else f" on rank {spec.rank}"
            return (f"the op ran {h.calls} time(s) but never inside block {spec.block}'s "
                    f"{spec.graph}{rank} (that block runs eager, on another pipeline stage, "
                    "or the model was not called as a whole)")
        if h.graphs_without_node:
            return (f"{h.graphs_without_node} compiled {spec.graph} graph(s) have no "
                    f"aten.{spec.op} #{spec.index} with a floating-point output")
        if not self.blocks_marked:
            return "the model never ran a forward (or no block was found to mark)"
        return (f"no compiled {spec.graph} graph ran the op: is [compile] on with the "
                "inductor backend, and did the blocks compile after start-up?")


_RUNTIME = _Runtime()


def _backward_enters(key: str, grad: torch.Tensor) -> None:
    _RUNTIME.backward_enters(key)


def _backward_leaves(key: str, grad: torch.Tensor) -> None:
    _RUNTIME.backward_leaves(key)


def _grad_tensors(tree: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


@functools.cache
def _op() -> Any:
    """Register ``titan_rocm::debug_corrupt`` (first install only: an unset variable
    registers nothing) and return its overload."""

    @torch.library.custom_op("titan_rocm::debug_corrupt", mutates_args=())
    def debug_corrupt(x: torch.Tensor, backward: bool) -> torch.Tensor:
        """A copy of ``x``, corrupted while the target block runs (module docstring)."""
        return _RUNTIME.run(x, backward)

    @debug_corrupt.register_fake
    def _fake(x: torch.Tensor, backward: bool) -> torch.Tensor:
        return torch.empty_like(x)

    return torch.ops.titan_rocm.debug_corrupt.default


def graph_kind(graph: torch.fx.Graph) -> str | None:
    """``forward`` / ``backward`` for AOTAutograd's training graphs (placeholders
    ``primals_*`` / ``tangents_*``); None for inference graphs."""
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    if any(name.startswith("tangents") for name in names):
        return "backward"
    if any(name.startswith("primals") for name in names):
        return "forward"
    return None


def candidate_nodes(graph: torch.fx.Graph, op: str) -> list[torch.fx.Node]:
    """The nodes ``index`` counts: calls of ``aten.<op>`` (any overload) with one
    floating-point tensor output, in graph order."""
    return [n for n in graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target.namespace == "aten" and n.target._opname == op
            and isinstance(n.meta.get("val"), torch.Tensor)
            and n.meta["val"].dtype.is_floating_point]


@functools.cache
def pass_class() -> type:
    """``CorruptPass``: the post-grad pass putting the op after the spec's node (it runs a
    ``previous`` pass first, if the job had one). Made on first use: importing Inductor
    costs seconds, which a process that never sets the variable must not pay."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class CorruptPass(CustomGraphPass):
        """The post-grad pass: the op after the spec's node (runs ``previous`` first, if any)."""

        def __init__(self, spec: CorruptSpec, previous: Any = None) -> None:
            self.spec = spec
            self.previous = previous

        def __call__(self, graph: torch.fx.Graph) -> None:
            if self.previous is not None:
                self.previous(graph)
            spec = self.spec
            if graph_kind(graph) != spec.graph:
                return
            nodes = candidate_nodes(graph, spec.op)
            if len(nodes) <= spec.index:
                _RUNTIME.hits.graphs_without_node += 1
                return
            node = nodes[spec.index]
            with graph.inserting_after(node):
                corrupted = graph.call_function(
                    _op(), (node, spec.graph == "backward"))
            node.replace_all_uses_with(corrupted, delete_user_cb=lambda user: user is not corrupted)
            val = node.meta["val"]
            fake_mode = getattr(val, "fake_mode", None)
            if fake_mode is not None:
                with fake_mode:
                    corrupted.meta["val"] = torch.empty_like(val)
            else:
                corrupted.meta["val"] = torch.empty_like(val)
            if "stack_trace" in node.meta:
                corrupted.meta["stack_trace"] = node.meta["stack_trace"]
            _RUNTIME.hits.graphs += 1
            log.debug("titan-rocm: %s: op after %s in a compiled %s graph", ENV, node.name,
                      spec.graph)

        def uuid(self) -> Any:
            """Inductor's cache key part: a graph with the op is never served to a clean run.
            Only what shapes the graph is in it: block, fraction, seed and rank are read
            by the op when it runs."""
            previous = self.previous.uuid() if isinstance(self.previous, CustomGraphPass) else (
                None if self.previous is None else id(self.previous))
            spec = self.spec
            return ("titan-rocm-debug-corrupt-v1", spec.graph, spec.op, spec.index, previous)

    return CorruptPass


def _mark_blocks(model: nn.Module) -> int:
    """Swap in the marking ``__call__`` on the outermost module of every block."""
    count = 0
    for key, block in _blocks(model):
        cls = type(block)
        if not getattr(cls, MARKED_ATTR, None):
            block.__class__ = _marked_class(cls)
        _RUNTIME.keys[block] = key
        count += 1
    return count


@functools.cache
def _marked_class(base: type) -> type:
    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return _RUNTIME.call_block(self, base.__call__, args, kwargs)

    return type(f"{base.__name__}CorruptMarked", (base,), {"__call__": __call__,
                                                            MARKED_ATTR: base})


def _blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.Module):
        return []
    return list(layers.named_children())


def _on_root_forward(module: nn.Module, args: Any) -> None:
    if torch.compiler.is_compiling():
        return
    state = module.__dict__.get(INSTALLED_ATTR)
    if state is None:
        return
    state["calls"] += 1
    if state["calls"] == 1:
        _RUNTIME.blocks_marked += _mark_blocks(module)
    elif state["calls"] == 2:
        _RUNTIME.report("after the first forward and backward")


def install(model: nn.Module, environ: Mapping[str, str] | None = None) -> CorruptSpec | None:
    """Install the fault on ``model`` if :data:`ENV` is set (idempotent per model).

    Called before the model is parallelized or compiled. A bad value stops start-up: the
    sentence is logged and the process exits 2 (no traceback).
    """
    try:
        spec = from_env(environ)
        if spec is None:
            return None
        if _RUNTIME.spec not in (None, spec):
            raise _fail(spec.text(), f"a different spec ({_RUNTIME.spec.text()}) is installed "
                                     "in this process already")
        keys = [key for key, _ in _blocks(model)]
        if keys and spec.key not in keys:
            raise _fail(spec.text(), f"block={spec.block} is not a block of this model "
                                     f"(model.layers has {', '.join(keys)})")
    except CorruptSpecError as error:
        log.error("titan-rocm: %s", error)
        raise SystemExit(2) from None
    if not keys:
        log_once(f"{ENV}:no-layers", logging.WARNING,
                 "titan-rocm: %s: %s has no model.layers: nothing to corrupt in it", ENV,
                 type(model).__name__)
        return spec
    if _RUNTIME.spec is None:
        _RUNTIME.spec = spec
        import torch._inductor.config as config

        previous = config.post_grad_custom_post_pass
        if isinstance(previous, pass_class()):
            previous = previous.previous
        _op()
        config.post_grad_custom_post_pass = pass_class()(spec, previous)
        atexit.register(_RUNTIME.report, "at exit")
        log_once(f"{ENV}:active", logging.WARNING,
                 "titan-rocm: %s=%s: TEST FAULT ACTIVE: Inductor corrupts %s; eager code is "
                 "untouched", ENV, spec.text(), spec.describe())
    if INSTALLED_ATTR not in model.__dict__:
        model.__dict__[INSTALLED_ATTR] = {"calls": 0}
        model.register_forward_pre_hook(_on_root_forward)
    return spec


def summary() -> dict[str, Any]:
    """The installed spec (None when inactive) and what it did in this process."""
    spec = _RUNTIME.spec
    return {"spec": None if spec is None else spec.to_dict(), "hits": _RUNTIME.hits.to_dict()}


def report(when: str) -> str | None:
    """Log one line saying how often the fault hit, or why it never did (once per ``when``);
    the line, or None when inactive or reported for ``when`` before."""
    return _RUNTIME.report(when)


def reset_counts() -> None:
    """Zero what the fault did (tests; a second job in the same process)."""
    _RUNTIME.hits = Hits()
    _RUNTIME.reported.clear()


def uninstall() -> None:
    """Take the pass out of Inductor's config, forget the spec, let its lines log again
    (tests; a second job in the same process)."""
    forget(ENV)
    if _RUNTIME.spec is None:
        return
    import torch._inductor.config as config

    current = config.post_grad_custom_post_pass
    if isinstance(current, pass_class()):
        config.post_grad_custom_post_pass = current.previous
    _RUNTIME.spec = None
    _RUNTIME.forward_block = _RUNTIME.backward_block = None
    _RUNTIME.window_hit = False
    reset_counts()
    atexit.unregister(_RUNTIME.report)
