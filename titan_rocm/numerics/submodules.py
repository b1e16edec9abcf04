"""Inside a block: its children (attention, the feed-forward or MoE, the norms) compared on
their own, teacher-forced (docs/numerics-audit.md#inside-a-block).

A compiled block has no child boundary at run time, so the job's values there do not exist.
A probed copy of the block is compiled instead, once per process and block layout, with the
job's own compile backend and Inductor settings: the same block code with a zero added at each
child's input and output. The zeros change no value; what the compiled backward sends into
them is its gradient at those points, and the hooks keep the compiled forward's values there.
Each child is then replayed alone, eager and in the reference's arithmetic, from those inputs
and that upstream gradient.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

from titan_rocm.numerics import blocks, fsdp, precision
from titan_rocm.numerics.attribution import clean_name, compiled_in_place, inner_module
from titan_rocm.numerics.precision import cast_input
from titan_rocm.numerics.record import BlockRecord
from titan_rocm.numerics.replay import backward_recorded, rows_of
from titan_rocm.numerics.result import AuditError
from titan_rocm.numerics.state import first_line, out_of_memory
from titan_rocm.numerics.stats import Accumulator

ALONE = " (alone)"
"""Suffix of a child's parameter gradient from its own replay (the block's has none)."""
AGREED = " (where the choices agree)"
"""Suffix of an output compared only where the integer tensors beside it (a router's expert
indices) are the same in the job's pass, the eager replay and the reference's."""


class Unprobed(RuntimeError):
    """A block's children cannot be compared on their own (the message is one sentence)."""


@dataclass
class ChildCall:
    """One child's call in the probed compiled pass: what its replays start from."""

    name: str
    module: nn.Module
    leaves: list[Any]
    spec: Any
    at: int
    """The leaf probed: the child's first floating positional input."""
    output: torch.Tensor
    grad_output: torch.Tensor | None = None
    grad_input: torch.Tensor | None = None
    param_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    output_compared: bool = True
    """False for an output beside discrete companions (the router's scores beside its expert
    indices): rounding flips a top-k choice now and then, which moves a gathered score by far
    more than rounding, so it is compared only where the choices agree (``choices``)."""
    choices: tuple[torch.Tensor, ...] = ()
    """The integer tensors beside such an output, shaped like it (the router's expert
    indices): which score each position holds."""


def children(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """The block's children that hold parameters (TorchTitan's attention, feed_forward or moe,
    attention_norm, ffn_norm), under any compile or checkpoint wrapper. In a block that runs
    eager around compiled children (:func:`composed`), an eager child holding compiled ones
    (stock 0.2.2's MoE: its router and shared experts compiled alone) brings its own children
    too (``moe.router``): their boundaries exist at run time, and a router fault is faint in
    the MoE's output among the experts'."""
    inner = inner_module(block)
    found = [(name, child) for name, child in inner.named_children() if _has_parameters(child)]
    if not composed(block):
        return found
    out = []
    for name, child in found:
        out.append((name, child))
        if composed(child):
            out += [(f"{name}.{n}", c) for n, c in child.named_children() if _has_parameters(c)]
    return out


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _dynamo_context(block: nn.Module) -> Any:
    ctx = getattr(block, "dynamo_ctx", None)
    if ctx is not None and getattr(getattr(block, "forward", None),
                                   "_torchdynamo_orig_callable", None) is None:
        return None  # its forward made eager (a quarantined block): nothing compiled runs
    if ctx is None and compiled_in_place(block):
        cells = getattr(block._compiled_call_impl, "__closure__", None) or ()
        ctx = next((c.cell_contents for c in cells if hasattr(c.cell_contents, "callback")),
                   None)
    return ctx


def backend_of(block: nn.Module) -> Any:
    """The compiler the job compiled ``block`` with (its mode and options), or None when the
    block is not compiled whole."""
    callback = getattr(_dynamo_context(block), "callback", None)
    for _ in range(8):
        if callback is None:
            return None
        inner = getattr(callback, "_torchdynamo_orig_backend", None)
        if inner is None:
            return callback
        callback = inner
    return None


def fullgraph_of(block: nn.Module) -> bool:
    """Whether the job compiled ``block`` as one graph (TorchTitan: dense blocks do)."""
    return bool(getattr(_dynamo_context(block), "fullgraph", False))


def composed(block: nn.Module) -> bool:
    """Whether ``block`` runs eager around compiled modules inside it (TorchTitan 0.2.2's stock
    compile of a MoE block: its attention, norms, router and shared experts each compiled
    alone). Their boundaries then exist at run time: the job's own call is probed."""
    inner = inner_module(block)
    return backend_of(block) is None and any(
        _dynamo_context(m) is not None for m in inner.modules() if m is not inner)


def why_not(record: BlockRecord, eager_runs: int) -> str | None:
    """Why ``record``'s block is compared only as a whole (a phrase), or None."""
    module = record.module
    around_compiled = composed(module)
    if backend_of(module) is None and not around_compiled:
        return "nothing in it is compiled (the block-level replay covers its eager code)"
    if around_compiled and fsdp.is_fsdp(list(inner_module(module).children())):
        return ("a module inside it is sharded on its own (FSDP), whose hooks the job's call "
                "would run again")
    if eager_runs != 1:
        return f"the eager replay needed {eager_runs} runs of rows to fit in memory"
    if not children(module):
        return "no child module with parameters"
    return None


def _probed_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # A function of our own: Dynamo keeps the probed graphs on this code object, apart from
    # the job's (a block compiled in place keeps its own on Module._call_impl). The block's
    # forward, not its hooks: FSDP's would shard its parameters again after the forward.
    return module.forward(*args, **kwargs)


_COMPILED: dict[tuple[int, bool], tuple[Any, Callable[..., Any]]] = {}
"""(id(backend), fullgraph) -> (backend, the probed call compiled with them): one per job
compile, so warm audits find the graphs the first compiled (a backend is not hashable)."""


def _compiled(backend: Any, fullgraph: bool) -> Callable[..., Any]:
    held = _COMPILED.get((id(backend), fullgraph))
    if held is None or held[0] is not backend:
        held = (backend, torch.compile(_probed_call, backend=backend, fullgraph=fullgraph))
        _COMPILED[(id(backend), fullgraph)] = held
    return held[1]


class Prober:
    """Forward hooks on a block's children: learn their boundaries' shapes (``learning``),
    then add a zero probe at each and keep what the compiled pass computes there."""

    def __init__(self) -> None:
        self.learning = True
        self.shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        self.probes: dict[str, torch.Tensor] = {}
        self.seen: list[tuple[str, str, Any]] = []
        self.refused: dict[str, str] = {}

    def pre(self, name: str, module: nn.Module, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        at = _first_float(args)
        if at is None:
            self.refused.setdefault(name, "it takes no floating tensor positionally")
            return None
        if self.learning:
            self.shapes[f"{name}.in"] = (args[at].shape, args[at].dtype)
            return None
        self.seen.append((name, "in", (args, kwargs)))
        probed = list(args)
        probed[at] = args[at] + self.probes[f"{name}.in"]
        return tuple(probed), kwargs

    def post(self, name: str, module: nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any], out: Any) -> Any:
        # One floating tensor, or a tuple whose first floating tensor is the one probed (the
        # router's scores beside its integer expert indices and counts).
        single = isinstance(out, torch.Tensor)
        at = 0 if single else (_first_float(out) if isinstance(out, tuple) else None)
        value = out if single else (None if at is None else out[at])
        if value is None or not value.is_floating_point():
            self.refused.setdefault(name, "its output holds no floating tensor")
            return None
        if self.learning:
            self.shapes[f"{name}.out"] = (value.shape, value.dtype)
            return None
        self.seen.append((name, "out", (value, single, () if single else choices_of(out, value))))
        probed = value + self.probes[f"{name}.out"]
        return probed if single else (*out[:at], probed, *out[at + 1:])

    def arm(self, device: torch.device) -> None:
        """Zero probes that want gradients, shaped as learned."""
        self.learning = False
        self.seen = []
        self.probes = {k: torch.zeros(shape, dtype=dtype, device=device, requires_grad=True)
                       for k, (shape, dtype) in self.shapes.items()}


@dataclass
class _Hooks:
    handles: list[Any]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def hooked(kids: list[tuple[str, nn.Module]], prober: Prober) -> _Hooks:
    """``prober``'s hooks on each child (removed by the caller)."""
    handles = []
    for name, child in kids:
        handles.append(child.register_forward_pre_hook(functools.partial(prober.pre, name),
                                                       with_kwargs=True))
        handles.append(child.register_forward_hook(functools.partial(prober.post, name),
                                                   with_kwargs=True))
    return _Hooks(handles)


def _block_inputs(record: BlockRecord) -> tuple[tuple[Any, ...], dict[str, Any], list[Any]]:
    leaves = [t.detach().requires_grad_() if needs else t
              for t, needs in zip(record.leaves, record.needs_grad, strict=True)]
    args, kwargs = pytree.tree_unflatten(leaves, record.spec)
    return args, kwargs, leaves


def learn(record: BlockRecord, kids: list[tuple[str, nn.Module]], prober: Prober) -> None:
    """One eager forward of the block, without gradients, for its children's boundary shapes."""
    args, kwargs, _ = _block_inputs(record)
    hooks = hooked(kids, prober)
    try:
        with torch.no_grad(), precision.eager(), \
                precision.autocast_as(record.device, record.autocast):
            _probed_call(inner_module(record.module), *args, **kwargs)
    finally:
        hooks.remove()
    if prober.refused:
        name, why = next(iter(prober.refused.items()))
        raise Unprobed(f"the {name} cannot be probed: {why}")


def probed_pass(record: BlockRecord, kids: list[tuple[str, nn.Module]],
                prober: Prober) -> dict[str, ChildCall]:
    """The block compiled with probes, forward from the job's inputs and backward from its
    output gradients; each child's call as the compiled code computed it."""
    prober.arm(record.device)
    args, kwargs, _ = _block_inputs(record)
    target = inner_module(record.module)
    backend = backend_of(record.module)
    # A composed block runs its own compiled children: the job's code, nothing compiled anew.
    run = _probed_call if backend is None else _compiled(backend, fullgraph_of(record.module))
    hooks = hooked(kids, prober)
    try:
        with precision.autocast_as(record.device, record.autocast):
            out = blocks.call_intercepted(record.key, record.module,
                                          lambda _m, *a, **k: run(target, *a, **k),
                                          args, kwargs)
        backward_recorded(record, pytree.tree_leaves(out), 0, rows_of(record))
    finally:
        hooks.remove()
    return _calls(kids, prober)


def _calls(kids: list[tuple[str, nn.Module]], prober: Prober) -> dict[str, ChildCall]:
    modules = dict(kids)
    calls: dict[str, ChildCall] = {}
    inputs: dict[str, Any] = {}
    for name, where, value in prober.seen:
        if where == "in":
            if name in inputs:
                raise Unprobed(f"the {name} runs more than once in one forward")
            inputs[name] = value
            continue
        args, kwargs = inputs[name]
        leaves, spec = pytree.tree_flatten((args, kwargs))
        first = args[_first_float(args)]  # a float: pre() refused the child otherwise
        at = next(i for i, t in enumerate(leaves) if t is first)
        output, single, choices = value
        # A parameter of a child probed inside this one (moe.router in moe) is compared there.
        inner = {id(q) for n, m in kids if n.startswith(f"{name}.") for q in m.parameters()}
        calls[name] = ChildCall(
            name, modules[name],
            [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves], spec, at,
            output.detach(), prober.probes[f"{name}.out"].grad,
            prober.probes[f"{name}.in"].grad,
            {n: q.grad for n, q in modules[name].named_parameters() if id(q) not in inner},
            single, tuple(c.detach() for c in choices))
    # In the order the children began (an enclosing child before those inside it).
    return {name: calls[name] for name, where, _ in prober.seen
            if where == "in" and name in calls}


def choices_of(out: tuple[Any, ...], value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The integer tensors of a child's output tuple shaped like its floating ``value`` (the
    router's expert indices beside its scores)."""
    return tuple(t for t in out if isinstance(t, torch.Tensor) and t is not value
                 and not t.is_floating_point() and not t.is_complex() and t.shape == value.shape)


def agreeing(*choices: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    """Where every run's choices are the same (None when a run has none, or they differ in
    number or shape): the positions whose outputs hold the same thing in each run."""
    first = choices[0]
    if not first or any(len(c) != len(first) for c in choices):
        return None
    mask = torch.ones(first[0].shape, dtype=torch.bool, device=first[0].device)
    for tensors in zip(*choices, strict=True):
        if any(t.shape != mask.shape for t in tensors):
            return None
        for t in tensors[1:]:
            mask &= tensors[0] == t.to(tensors[0].device)
    return mask


def agreeing_rows(same: torch.Tensor | None,
                  grads: tuple[torch.Tensor | None, ...]) -> torch.Tensor | None:
    """The rows (tokens) of the input gradients ``grads`` whose every choice agrees (``same``
    from :func:`agreeing`, one row of choices per input row); None when there is no such mask
    or the gradients are not one row per choice row (then compared whole)."""
    if same is None or same.dim() < 1 or any(
            g is None or g.dim() < 1 or g.shape[0] != same.shape[0] for g in grads):
        return None
    return same.reshape(same.shape[0], -1).all(dim=1)


def _first_float(args: tuple[Any, ...]) -> int | None:
    """The child's probed input: its first floating tensor given positionally."""
    return next((i for i, a in enumerate(args)
                 if isinstance(a, torch.Tensor) and a.is_floating_point()), None)


@dataclass
class ChildReplay:
    """One replay of a child alone: its output, input gradient and parameters' gradients."""

    output: torch.Tensor
    grad_input: torch.Tensor | None
    param_grads: dict[str, torch.Tensor | None]
    choices: tuple[torch.Tensor, ...] = ()
    """As :attr:`ChildCall.choices`, this replay's."""


def replay_child(call: ChildCall, dtype: torch.dtype | None) -> ChildReplay:
    """``call``'s child alone, from its recorded inputs and upstream gradient, under the
    caller's arithmetic (``dtype``: the reference's, else the job's own)."""
    leaves = [cast_input(t, dtype) for t in call.leaves]
    leaves[call.at] = leaves[call.at].detach().requires_grad_()
    args, kwargs = pytree.tree_unflatten(leaves, call.spec)
    out = call.module(*args, **kwargs)
    choices: tuple[torch.Tensor, ...] = ()
    if not isinstance(out, torch.Tensor):
        whole, out = out, out[_first_float(out)]  # the probed output (Prober.post)
        choices = tuple(c.detach() for c in choices_of(whole, out))
    if call.grad_output is not None and out.requires_grad:
        torch.autograd.backward([out], [call.grad_output.to(out.dtype)])
    grads = {n: p.grad for n, p in call.module.named_parameters()}
    for p in call.module.parameters():
        p.grad = None
    return ChildReplay(out.detach(), leaves[call.at].grad, grads, choices)


def compare(acc: Accumulator, key: str, call: ChildCall, eager: ChildReplay,
            ref: ChildReplay, rtol: float) -> None:
    """The child's output, input gradient and parameters' gradients: the compiled pass's,
    eager's and the reference's."""
    at = f"layers.{key}.{call.name}"
    same = None if call.output_compared else agreeing(call.choices, eager.choices, ref.choices)
    if call.output_compared:
        acc.add(f"{at} output", key, "output", call.output, eager.output, ref.output, rtol,
                module=call.name)
    elif same is not None and bool(same.any()):
        acc.add(f"{at} output{AGREED}", key, "output", call.output[same], eager.output[same],
                ref.output[same], rtol, module=call.name)
    grads = (call.grad_input, eager.grad_input, ref.grad_input)
    rows = agreeing_rows(same, grads)
    if rows is None:
        acc.add(f"{at} input grad", key, "input_grad", *grads, rtol, module=call.name)
    elif bool(rows.any()):
        # A token routed elsewhere in one run has another gradient there for an honest reason.
        acc.add(f"{at} input grad{AGREED}", key, "input_grad",
                *(g[rows.to(g.device)] for g in grads), rtol, module=call.name)
    for n, job in call.param_grads.items():
        acc.add(f"{at}.{clean_name(n)}{ALONE}", key, "param_grad", job, eager.param_grads.get(n),
                ref.param_grads.get(n), rtol, module=call.name)


def _shape_key(record: BlockRecord) -> tuple[Any, ...]:
    tensors = tuple((tuple(t.shape), t.dtype) for t in record.leaves
                    if isinstance(t, torch.Tensor))
    inner = inner_module(record.module)
    # The children's names too: a dense and a MoE block share one class and one input.
    return (type(inner), tuple(name for name, _ in children(inner)), tensors, record.autocast)


@dataclass
class Inside:
    """The children of every audited block (``[rocm] numerics_audit_submodules``): ``on``
    requires each to be looked inside, ``auto`` compares a block it cannot as a whole and says
    why once per audit."""

    mode: str
    shapes: dict[tuple[Any, ...], dict[str, tuple[torch.Size, torch.dtype]]] = field(
        default_factory=dict)
    whole: dict[str, list[str]] = field(default_factory=dict)
    """Why -> the blocks compared only as a whole for it."""

    @contextlib.contextmanager
    def gathered(self, record: BlockRecord) -> Iterator[None]:
        """Around the probed pass and the children's replays: an FSDP block's parameters
        whole."""
        if why_not(record, 1) is None and fsdp.is_fsdp([record.module]):
            with fsdp.unsharded(record.module):
                yield
        else:
            yield

    def calls(self, record: BlockRecord, eager_runs: int) -> dict[str, ChildCall]:
        """The probed compiled pass of ``record``'s block (empty when it cannot run: noted);
        inside :meth:`gathered`."""
        why = why_not(record, eager_runs)
        kids = children(record.module)
        try:
            if why is not None:
                raise Unprobed(why)
            # After gathering: FSDP's own shards are DTensors, tensor parallel's stay so.
            if any(callable(getattr(p, "to_local", None)) for _, c in kids
                   for p in c.parameters()):
                raise Unprobed("parameters are DTensors (tensor parallel)")
            return probed_pass(record, kids, self._prober(record, kids))
        except Unprobed as exc:
            self._whole(record.key, str(exc))
        except Exception as exc:  # noqa: BLE001 - a compile the block-level audit does not need
            if out_of_memory(exc):
                raise
            self._whole(record.key, f"the probed copy did not compile ({type(exc).__name__}: "
                                    f"{first_line(exc)})")
        finally:
            for _, child in kids:
                for p in child.parameters():
                    p.grad = None
        return {}

    def _prober(self, record: BlockRecord, kids: list[tuple[str, nn.Module]]) -> Prober:
        prober = _PROBER
        key = _shape_key(record)
        if key not in self.shapes:
            prober.learning, prober.shapes, prober.refused = True, {}, {}
            learn(record, kids, prober)
            self.shapes[key] = dict(prober.shapes)
        prober.shapes = self.shapes[key]
        return prober

    def _whole(self, key: str, why: str) -> None:
        if self.mode == "on":
            raise AuditError(f"numerics_audit_submodules = 'on', but block {key} cannot be "
                             f"looked inside: {why}; set it to 'auto' to compare such blocks "
                             "as a whole")
        self.whole.setdefault(why, []).append(key)

    def notes(self) -> list[str]:
        """One note per reason a block was compared only as a whole."""
        return [f"block{'s' if len(keys) > 1 else ''} {', '.join(keys)} compared as a whole, "
                f"not child by child: {why}" for why, keys in self.whole.items()]


_PROBER = Prober()
"""One per process: the probed graphs guard on the hooks' owner, so a new one would compile
them again at every audit."""
