"""``TITAN_ROCM_DEBUG_CORRUPT``: a fault injected into compiled code only, to prove the audit
(docs/numerics-audit-fault.md). Installed by ``titan-rocm audit``, tests and benchmarks only.

The op decides at run time whether to hit because identical TransformerBlocks share one
compiled graph (``inline_inbuilt_nn_modules``); the block interceptor
(:mod:`titan_rocm.numerics.blocks`) tells it, which also lets :func:`switch` move the fault
without recompiling.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from titan_rocm.log import forget, log, log_once
from titan_rocm.numerics import blocks

ENV = "TITAN_ROCM_DEBUG_CORRUPT"
FORMAT = ("block=K|head[,graph=backward|forward][,op=mul][,index=0][,fraction=0.03][,seed=0]"
          "[,rank=R][,module=NAME]")
EXAMPLE = "block=1,graph=backward,op=mul,index=0,fraction=0.03,seed=0"
GRAPHS = ("backward", "forward")
HEAD = "head"
"""``block=head``: the fault hits compiled code run outside every block (the loss)."""
KEYS = ("block", "graph", "op", "index", "fraction", "seed", "rank", "module")

_INT = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+\.")
_OP = re.compile(r"[a-z_][a-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


class CorruptSpecError(ValueError):
    """``TITAN_ROCM_DEBUG_CORRUPT`` is not accepted (the message names the bad part)."""


@dataclass(frozen=True)
class CorruptSpec:
    """What to corrupt: ``fraction`` of the ``index``-th ``aten.<op>`` node's output of one block's
    graph."""

    block: int | str
    """A ``model.layers`` key, or ``"head"``: compiled code outside every block (the loss)."""
    graph: str = "backward"
    op: str = "mul"
    index: int = 0
    fraction: float = 0.03
    seed: int = 0
    rank: int | None = None
    module: str | None = None
    """Only nodes traced inside this child of the block (``attention``, ``moe.router``): its
    path among the module names Dynamo records on each node; None: anywhere."""

    @property
    def key(self) -> str:
        """The block's key in ``model.layers``."""
        return str(self.block)

    @property
    def where(self) -> str:
        """``block 3`` or ``the head``."""
        return "the head" if self.block == HEAD else f"block {self.block}"

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
        inside = "" if self.module is None else f" inside {self.module}"
        return (f"{100 * self.fraction:.4g} % of the output of aten.{self.op} #{self.index}"
                f"{inside} in {self.where}'s compiled {self.graph} graph{where} "
                f"(seed {self.seed})")


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
    if key == "block" and value == HEAD:
        return value
    if key in ("block", "index", "seed", "rank"):
        if not _INT.fullmatch(value):
            also = " or head" if key == "block" else ""
            raise _fail(text, f"{key}={value!r} is not accepted ({key} is an integer >= 0"
                              f"{also})")
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
    if key == "module":
        if not _MODULE.fullmatch(value):
            raise _fail(text, f"module={value!r} is not accepted (a child's name in the block, "
                              "dotted for deeper ones: attention, feed_forward, moe.router)")
        return value
    if not _OP.fullmatch(value) or not _aten_op_exists(value):
        raise _fail(text, f"op={value!r} is not accepted (an ATen operator name as the "
                          "post-grad graph shows it: mul, add, mm, bmm, sigmoid, ...)")
    return value


def parse(text: str) -> CorruptSpec:
    """The spec ``text`` describes (CorruptSpecError naming the bad entry)."""
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
    """The spec of :data:`ENV`; None when unset or empty."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    return parse(text) if text else None


@dataclass
class Hits:
    """What the fault did in this process."""
    graphs: int = 0
    graphs_without_node: int = 0
    calls: int = 0
    """Times compiled code ran the op (any block: the graph may be shared)."""
    hits: int = 0
    elements: int = 0
    replaced: int = 0
    changed: int = 0
    """Of those, elements whose value changed (a neighbour can hold the same value)."""
    change_sq: float = 0.0
    """The sum of the squared changes: with ``output_sq`` the fault's size, which a swap of
    near-equal values (a router's scores at initialisation) keeps under rounding's."""
    output_sq: float = 0.0
    """The sum of the squared outputs the fault ran on."""

    @property
    def relative_change(self) -> float:
        """The change's norm over the outputs' (0 when nothing ran)."""
        return (self.change_sq / self.output_sq) ** 0.5 if self.output_sq > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        """JSON-able fields."""
        return dataclasses.asdict(self)


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


class _Runtime:
    def __init__(self) -> None:
        self.spec: CorruptSpec | None = None
        self.graphs: tuple[str, ...] = ()
        self.hits = Hits()
        self.forward_block: str | None = None
        self.backward_block: str | None = None
        self.window_hit = False
        self.blocks_marked = 0
        self.reported: set[str] = set()
        self.calls_seen = 0
        self.active = True

    # -- block windows (the interceptor and its tensor hooks) ----------------------------------
    def around(self, key: str, module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any], proceed: blocks.Call) -> Any:
        outer = self.forward_block
        self.forward_block = key
        if self.spec is not None and key == self.spec.key:
            self.window_hit = False
        try:
            out = proceed(args, kwargs)
        finally:
            self.forward_block = outer
        if torch.is_grad_enabled():
            for t in blocks.grad_tensors(out):
                t.register_hook(functools.partial(_backward_enters, key))
            for t in blocks.grad_tensors((args, kwargs)):
                t.register_hook(functools.partial(_backward_leaves, key))
        self.calls_seen += 1
        if self.calls_seen == 2 * max(1, self.blocks_marked):
            self.report("after the first forward and backward")
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
        if spec is not None and spec.block == HEAD:
            # Outside every block: each pass runs the compiled loss once, so no window.
            block = HEAD if block is None else None
            self.window_hit = False
        if (spec is None or not self.active or self.window_hit or block != spec.key
                or (spec.graph == "backward") != backward
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
            # Finite values only: a grouped GEMM leaves the rows past its last group unwritten.
            # A complex output (the rotary multiply) counts its real and imaginary parts.
            real = torch.view_as_real(work) if work.is_complex() else work
            self.hits.output_sq += float(torch.linalg.vector_norm(torch.nan_to_num(
                real, nan=0.0, posinf=0.0, neginf=0.0), dtype=torch.float64) ** 2)
            before = work[idx]
            work[idx] = work[(idx + 1) % n]  # the right-hand side is read before the write
            changed = int((work[idx] != before).sum().item())
            wide = torch.complex128 if work.is_complex() else torch.float64
            change = (work[idx].to(wide) - before.to(wide)).abs()
            self.hits.change_sq += float(change[torch.isfinite(change)].square().sum())
        self.hits.hits += 1
        self.hits.elements += n
        self.hits.replaced += replaced
        self.hits.changed += changed
        out = torch.empty_like(x)
        out.copy_(work.view(x.shape))
        return out

    # -- reporting ------------------------------------------------------------------------------
    def report(self, when: str) -> str | None:
        spec = self.spec
        if spec is None or when in self.reported:
            return None
        self.reported.add(when)
        h = self.hits
        if h.hits:
            line = (f"titan-rocm: {ENV} {when}: corrupted {spec.where}'s compiled "
                    f"{spec.graph} {h.hits} time(s), {h.changed} of {h.elements} elements "
                    f"changed ({100.0 * h.changed / max(h.elements, 1):.2f} %), by "
                    f"{100.0 * h.relative_change:.3g} % of the output's norm; the op is in "
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
            return (f"the op ran {h.calls} time(s) but never inside {spec.where}'s "
                    f"{spec.graph}{rank} (that block runs eager, on another pipeline stage, "
                    "or the model was not called as a whole)")
        if h.graphs_without_node:
            return (f"{h.graphs_without_node} compiled {spec.graph} graph(s) have no "
                    f"aten.{spec.op} #{spec.index} with a floating-point output")
        if not self.blocks_marked:
            return "no block was found to mark (the model has no model.layers)"
        return (f"no compiled {spec.graph} graph ran the op: is [compile] on with the "
                "inductor backend, and did the blocks compile after start-up?")


_RUNTIME = _Runtime()


def _backward_enters(key: str, grad: torch.Tensor) -> None:
    _RUNTIME.backward_enters(key)


def _backward_leaves(key: str, grad: torch.Tensor) -> None:
    _RUNTIME.backward_leaves(key)


@functools.cache
def _op() -> Any:
    """Registered on first install only: an unset variable registers nothing."""

    @torch.library.custom_op("titan_rocm::debug_corrupt", mutates_args=())
    def debug_corrupt(x: torch.Tensor, backward: bool) -> torch.Tensor:
        """A copy of ``x``, corrupted while the target block runs."""
        return _RUNTIME.run(x, backward)

    @debug_corrupt.register_fake
    def _fake(x: torch.Tensor, backward: bool) -> torch.Tensor:
        return torch.empty_like(x)

    return torch.ops.titan_rocm.debug_corrupt.default


def graph_kind(graph: torch.fx.Graph) -> str | None:
    """``forward`` / ``backward`` for AOTAutograd's training graphs; None for inference graphs."""
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    if any(name.startswith("tangents") for name in names):
        return "backward"
    if any(name.startswith("primals") for name in names):
        return "forward"
    return None


def feeding_first_output(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """AOTAutograd's forward graph returns the block's output first, the saved tensors after it."""
    out = next((n for n in graph.nodes if n.op == "output"), None)
    if out is None or not out.args:
        return set()
    first = out.args[0]
    first = first[0] if isinstance(first, (tuple, list)) and first else first
    if not isinstance(first, torch.fx.Node):
        return set()
    seen, todo = set(), [first]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        todo.extend(node.all_input_nodes)
    return seen


_NOT_NAMES = frozenset({"L", "G", "self", "module", "_modules", "_orig_mod",
                        "_checkpoint_wrapped_module", "forward", "__closure__",
                        "cell_contents", "__self__", "__dict__"})
"""Identifiers of Dynamo's module paths that name no child of the block: its sources
(``L['self']._modules['attention']``) and the walk through a method's closure that TorchTitan
0.3.0's MoE records (``moe.forward.__closure__[0].cell_contents.__self__.router``)."""


def traced_inside(node: torch.fx.Node, module: str) -> bool:
    """Whether ``node`` was traced inside the block's child ``module`` (dotted), by the module
    stack Dynamo records (``fwd_nn_module_stack`` on a backward node: its forward's)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    want = module.split(".")
    for path, *_ in stack.values():
        names = [n for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(path))
                 if n not in _NOT_NAMES]
        if any(names[i:i + len(want)] == want for i in range(len(names))):
            return True
    return False


def candidate_nodes(graph: torch.fx.Graph, op: str,
                    module: str | None = None) -> list[torch.fx.Node]:
    """``aten.<op>`` calls with one floating or complex output (llama3's rotary embedding
    multiplies complex numbers), inside ``module`` if given; in a forward
    graph only those feeding the block's output (a value only saved for the backward shows its
    fault there).
    """
    found = [n for n in graph.nodes
             if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
             and n.target.namespace == "aten" and n.target._opname == op
             and isinstance(n.meta.get("val"), torch.Tensor)
             and (n.meta["val"].dtype.is_floating_point or n.meta["val"].dtype.is_complex)
             and (module is None or traced_inside(n, module))]
    if graph_kind(graph) == "forward":
        feeding = feeding_first_output(graph)
        found = [n for n in found if n in feeding]
    return found


@functools.cache
def pass_class() -> type:
    """Made on first use: importing Inductor costs seconds a process without the fault must not
    pay."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class CorruptPass(CustomGraphPass):
        """The post-grad pass: the op after the spec's node (runs ``previous`` first, if any)."""

        def __init__(self, op: str, index: int, graphs: tuple[str, ...],
                     previous: Any = None, module: str | None = None) -> None:
            self.op, self.index, self.graphs, self.module = op, index, graphs, module
            self.previous = previous

        def __call__(self, graph: torch.fx.Graph) -> None:
            if self.previous is not None:
                self.previous(graph)
            kind = graph_kind(graph)
            if kind not in self.graphs:
                return
            nodes = candidate_nodes(graph, self.op, self.module)
            if len(nodes) <= self.index:
                _RUNTIME.hits.graphs_without_node += 1
                return
            node = nodes[self.index]
            with graph.inserting_after(node):
                corrupted = graph.call_function(_op(), (node, kind == "backward"))
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
            log.debug("titan-rocm: %s: op after %s in a compiled %s graph", ENV, node.name, kind)

        def uuid(self) -> Any:
            """Inductor's cache key part, so a graph with the op never serves a clean run."""
            previous = self.previous.uuid() if isinstance(self.previous, CustomGraphPass) else (
                None if self.previous is None else id(self.previous))
            return ("titan-rocm-debug-corrupt-v5", self.graphs, self.module, self.op, self.index,
                    previous)

    return CorruptPass


def install(model_parts: list[nn.Module], spec: CorruptSpec | None = None,
            graphs: tuple[str, ...] | None = None,
            environ: Mapping[str, str] | None = None) -> CorruptSpec | None:
    """Install the fault on ``model_parts`` before anything compiles; idempotent for the same op and
    index. None when there is nothing to install; CorruptSpecError when not accepted.
    """
    spec = spec if spec is not None else from_env(environ)
    if spec is None:
        return None
    graphs = tuple(graphs or (spec.graph,))
    if spec.graph not in graphs:
        raise _fail(spec.text(), f"graph={spec.graph} is not among the graphs installed "
                                 f"({', '.join(graphs)})")
    found = [kb for part in model_parts for kb in blocks.mark(part)]
    keys = [key for key, _ in found]
    if not keys:
        log_once(f"{ENV}:no-layers", logging.WARNING,
                 "titan-rocm: %s: the model has no model.layers: nothing to corrupt in it", ENV)
        return spec
    if spec.key not in keys and spec.block != HEAD:
        raise _fail(spec.text(), f"block={spec.block} is not a block of this model "
                                 f"(model.layers has {', '.join(keys)})")
    if _RUNTIME.spec is not None and (_site(_RUNTIME.spec) != _site(spec)
                                      or not set(graphs) <= set(_RUNTIME.graphs)):
        raise _fail(spec.text(), f"a different fault ({_RUNTIME.spec.text()}, in "
                                 f"{'/'.join(_RUNTIME.graphs)} graphs) is installed in this "
                                 "process already")
    _RUNTIME.blocks_marked = len(keys)
    _RUNTIME.active = True
    if _RUNTIME.spec is None:
        import torch._inductor.config as config

        previous = config.post_grad_custom_post_pass
        if isinstance(previous, pass_class()):
            previous = previous.previous
        _op()
        config.post_grad_custom_post_pass = pass_class()(spec.op, spec.index, graphs, previous,
                                                         spec.module)
        _RUNTIME.graphs = graphs
        blocks.push(_RUNTIME)
        atexit.register(_RUNTIME.report, "at exit")
    _RUNTIME.spec = spec
    log_once(f"{ENV}:active", logging.WARNING,
             "titan-rocm: %s=%s: TEST FAULT ACTIVE: Inductor corrupts %s; eager code is "
             "untouched", ENV, spec.text(), spec.describe())
    return spec


def _site(spec: CorruptSpec) -> tuple[str | None, str, int]:
    """What the compiled graphs hold: a fault moves between blocks, never between sites."""
    return spec.module, spec.op, spec.index


def switch(spec: CorruptSpec | None) -> None:
    """Move the installed fault to ``spec`` (None: off) without recompiling."""
    if spec is not None:
        current = _RUNTIME.spec
        if current is None or _site(current) != _site(spec) \
                or spec.graph not in _RUNTIME.graphs:
            raise _fail(spec.text(), "the installed fault cannot switch to it (install it "
                                     "with this module, op, index and graph first)")
    _RUNTIME.active = spec is not None
    if spec is not None:
        _RUNTIME.spec = spec
    _RUNTIME.window_hit = False
    graphs, without = _RUNTIME.hits.graphs, _RUNTIME.hits.graphs_without_node
    reset_counts()
    _RUNTIME.hits.graphs, _RUNTIME.hits.graphs_without_node = graphs, without


def summary() -> dict[str, Any]:
    """The installed spec (None when inactive) and what it did in this process."""
    spec = _RUNTIME.spec
    return {"spec": None if spec is None else spec.to_dict(), "hits": _RUNTIME.hits.to_dict()}


def report(when: str) -> str | None:
    """Log how often the fault hit, or why it never did, once per ``when``; the line or None."""
    return _RUNTIME.report(when)


def reset_counts() -> None:
    """Zero what the fault did (tests; a second job in the same process)."""
    _RUNTIME.hits = Hits()
    _RUNTIME.reported.clear()


def uninstall() -> None:
    """Take the pass and interceptor off and forget the spec (tests; a second job in the
    process)."""
    forget(ENV)
    if _RUNTIME.spec is None:
        return
    import torch._inductor.config as config

    current = config.post_grad_custom_post_pass
    if isinstance(current, pass_class()):
        config.post_grad_custom_post_pass = current.previous
    blocks.remove(_RUNTIME)
    _RUNTIME.spec = None
    _RUNTIME.graphs = ()
    _RUNTIME.forward_block = _RUNTIME.backward_block = None
    _RUNTIME.window_hit = False
    _RUNTIME.calls_seen = 0
    _RUNTIME.active = True
    reset_counts()
    atexit.unregister(_RUNTIME.report)
