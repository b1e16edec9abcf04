"""``TITAN_ROCM_DEBUG_CORRUPT``: the fault injected into compiled code only
(titan_rocm/testing/corrupt.py).

Parsing (every bad value is one sentence naming it), the op's corruption rate, the forward
nodes it counts, switching it at run time, and TorchTitan 0.2.2's real trainer on CPU
(``tests/support/cpu_trainer.py``, its blocks compiled by the model's own ``apply_compile``
as ``parallelize_fn`` does on a GPU, llama3 with three blocks and ``converters = ["rocm"]``):
block 1's gradients change, and nothing the corruption cannot reach does, bit for bit; an
eager run with the fault installed is bit-identical to a clean one.
"""

from __future__ import annotations

import collections
import logging
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import cpu_trainer
from titan_rocm.testing import corrupt
from titan_rocm.testing.corrupt import ENV, CorruptSpec, CorruptSpecError, parse

N_LAYERS = 3
BLOCK = 1


@pytest.fixture(autouse=True)
def _clean_state():
    corrupt.uninstall()
    yield
    corrupt.uninstall()


# -- parsing ----------------------------------------------------------------------------------

def test_defaults_and_the_documented_example() -> None:
    assert parse("block=3") == CorruptSpec(block=3)
    spec = parse("block=3,graph=backward,op=mul,index=0,fraction=0.03,seed=0")
    assert spec == CorruptSpec(3, "backward", "mul", 0, 0.03, 0)
    assert parse(" block = 2 , graph=forward, fraction=1e-2, rank=1 ") == CorruptSpec(
        block=2, graph="forward", fraction=0.01, rank=1)
    assert corrupt.from_env({}) is None
    assert corrupt.from_env({ENV: "  "}) is None
    assert corrupt.from_env({ENV: "block=0"}) == CorruptSpec(block=0)


specs = st.builds(
    CorruptSpec,
    block=st.integers(0, 10_000),
    graph=st.sampled_from(corrupt.GRAPHS),
    op=st.sampled_from(["mul", "add", "mm", "bmm", "sigmoid", "div"]),
    index=st.integers(0, 1000),
    fraction=st.floats(1e-6, 1.0, allow_nan=False, allow_infinity=False),
    seed=st.integers(0, 2**31),
    rank=st.none() | st.integers(0, 1023),
    module=st.none() | st.sampled_from(["attention", "feed_forward", "moe.router"]),
)


@given(specs)
def test_every_spec_round_trips(spec: CorruptSpec) -> None:
    assert parse(spec.text()) == spec


def _valid(key: str, value: str) -> bool:
    try:
        parse("block=0" if key == "block" else f"block=0,{key}={value}")
        parse(f"{key}={value}" if key == "block" else "block=0")
    except CorruptSpecError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(corrupt.KEYS), st.text(min_size=1, max_size=12))
def test_a_bad_value_is_one_sentence_naming_it(key: str, value: str) -> None:
    value = value.strip().replace(",", ";")
    text = f"{key}={value}" if key == "block" else f"block=0,{key}={value}"
    try:
        parse(text)
    except CorruptSpecError as error:
        message = str(error)
        assert "\n" not in message
        assert message.startswith(f"{ENV}={text!r}: ")
        assert "accepted: block=K" in message
        if value:
            assert repr(value) in message
    else:  # accepted: then it really is a value of that key
        assert value
        spec = parse(text)
        got = getattr(spec, key)
        if key == "fraction":
            assert 0 < got <= 1 and math.isfinite(got)
        elif key in ("block", "index", "seed", "rank"):
            assert got == int(value) >= 0
        elif key == "graph":
            assert got in corrupt.GRAPHS
        elif key == "module":
            assert got == value and all(part.isidentifier() for part in got.split("."))
        else:
            assert hasattr(torch.ops.aten, got)


@pytest.mark.parametrize("text,named", [
    ("", "entry ''"),
    ("graph=backward", "block=K is missing"),
    ("block=1,block=2", "key 'block' is given twice"),
    ("block=1,where=2", "key 'where' is not accepted"),
    ("block=1,", "entry ''"),
    ("block", "entry 'block' is not key=value"),
    ("block=-1", "block='-1'"),
    ("block=1,fraction=0", "fraction='0'"),
    ("block=1,fraction=1.5", "fraction='1.5'"),
    ("block=1,fraction=nan", "fraction='nan'"),
    ("block=1,fraction=3%", "fraction='3%'"),
    ("block=1,graph=both", "graph='both'"),
    ("block=1,op=mull", "op='mull'"),
    ("block=1,op=aten.mul", "op='aten.mul'"),
    ("block=1,index=first", "index='first'"),
])
def test_bad_values_named(text: str, named: str) -> None:
    with pytest.raises(CorruptSpecError, match="accepted: block=K") as caught:
        parse(text)
    assert named in str(caught.value)


def test_a_bad_value_or_block_is_the_sentence() -> None:
    model = _TinyBlocks()
    with pytest.raises(CorruptSpecError) as caught:
        corrupt.install([model], environ={ENV: "block=1,fraction=2"})
    assert str(caught.value) == (
        f"{ENV}='block=1,fraction=2': fraction='2' is not accepted (a number in (0, 1], e.g. "
        f"0.03 for 3 % of the node's elements); accepted: {corrupt.FORMAT} "
        f"(e.g. {corrupt.EXAMPLE})")
    with pytest.raises(CorruptSpecError,
                       match=r"block=7 is not a block of this model \(model.layers has 0, 1, 2\)"):
        corrupt.install([model], environ={ENV: "block=7"})


def test_unset_installs_nothing() -> None:
    import torch._inductor.config as inductor_config

    from titan_rocm.numerics import blocks

    model = _TinyBlocks()
    before = inductor_config.post_grad_custom_post_pass
    assert corrupt.install([model], environ={}) is None
    assert inductor_config.post_grad_custom_post_pass is before
    assert blocks.key_of(model.layers["0"]) is None  # nothing marked
    assert corrupt.summary()["spec"] is None


def test_switch_moves_the_fault_within_the_graphs_it_is_in() -> None:
    corrupt.install([_TinyBlocks()], corrupt.CorruptSpec(block=0), graphs=("forward",
                                                                            "backward"))
    corrupt.switch(CorruptSpec(block=2, graph="forward", fraction=0.5))
    assert corrupt.summary()["spec"]["block"] == 2
    x = torch.randn(100)
    runtime = corrupt._RUNTIME
    runtime.forward_block = "2"
    assert not torch.equal(corrupt._op()(x, False), x)
    corrupt.switch(None)  # off: the op copies
    runtime.forward_block = "2"
    assert torch.equal(corrupt._op()(x, False), x)
    with pytest.raises(CorruptSpecError, match="cannot switch to it"):
        corrupt.switch(CorruptSpec(block=1, op="add"))
    corrupt.uninstall()
    corrupt.install([_TinyBlocks()], corrupt.CorruptSpec(block=0))  # backward graphs only
    with pytest.raises(CorruptSpecError, match="cannot switch to it"):
        corrupt.switch(CorruptSpec(block=1, graph="forward"))


def test_a_forward_graph_counts_only_the_nodes_the_blocks_output_depends_on() -> None:
    """AOTAutograd's forward graph returns the block's output first and what the backward
    saves after it: a node only saved is the backward's input, not the block's output."""
    graph = torch.fx.Graph()
    x = graph.placeholder("primals_1")
    saved = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    out = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
    graph.output((out, saved))
    for node in (saved, out):
        node.meta["val"] = torch.empty(2)
    assert corrupt.graph_kind(graph) == "forward"
    assert corrupt.candidate_nodes(graph, "mul") == [out]


class _TinyBlocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(4, 4) for i in range(3)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


# -- the op -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fraction", [0.01, 0.03, 0.10])
def test_the_op_replaces_that_fraction_by_neighbours_only_inside_the_block(fraction) -> None:
    corrupt.install([_TinyBlocks()], environ={ENV: f"block=1,fraction={fraction},seed=5"})
    op = corrupt._op()
    runtime = corrupt._RUNTIME
    x = torch.randn(64, 500).t()  # non-contiguous, every value distinct
    runtime.backward_block = "0"
    assert torch.equal(op(x, True), x)  # another block's backward
    runtime.backward_block = "1"
    assert torch.equal(op(x, False), x)  # block 1's backward is running, not its forward
    y = op(x, True)
    assert y.stride() == x.stride() and y.shape == x.shape
    changed = (y != x).flatten()
    assert changed.sum().item() == round(fraction * x.numel())
    # each changed element holds its flat neighbour's value: finite, in range
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    where = changed.nonzero().flatten()
    assert torch.equal(flat_y[where], flat_x[(where + 1) % x.numel()])
    assert torch.equal(op(x, True), x)  # once per pass of the block
    hits = corrupt.summary()["hits"]
    assert hits["hits"] == 1 and hits["calls"] == 4
    assert hits["changed"] == hits["replaced"] == round(fraction * x.numel())
    # the fault's size, which the log line reports: the change's norm over the output's
    size = ((y.double() - x.double()).norm() / x.double().norm()).item()
    assert runtime.hits.relative_change == pytest.approx(size, rel=1e-9) and size > 0
    # unwritten memory (a grouped GEMM's rows past its last group) counts for nothing
    runtime.backward_enters("1")
    x_nan = x.clone()
    x_nan[0, :] = float("nan")
    corrupt.reset_counts()
    op(x_nan, True)
    assert math.isfinite(runtime.hits.relative_change) and runtime.hits.relative_change > 0
    # a complex output (the rotary multiply): its real and imaginary parts
    c = torch.complex(x, x.flip(0)).contiguous()
    runtime.backward_enters("1")
    corrupt.reset_counts()
    cy = op(c, True)
    wide, cw = cy.to(torch.complex128), c.to(torch.complex128)
    size = ((wide - cw).abs().norm() / cw.abs().norm()).item()
    assert runtime.hits.relative_change == pytest.approx(size, rel=1e-9) and size > 0
    runtime.backward_enters("1")  # block 1's next backward: hits again, other positions
    z = op(x, True)
    assert (z != x).sum().item() == round(fraction * x.numel()) and not torch.equal(z, y)


def test_graph_kind_from_aot_autograd_placeholders() -> None:
    seen: list[str | None] = []

    def recorder(graph: torch.fx.Graph) -> None:
        seen.append(corrupt.graph_kind(graph))

    lin = torch.nn.Linear(4, 4)
    with torch._inductor.config.patch(post_grad_custom_post_pass=recorder, compile_threads=1):
        torch._dynamo.reset()
        f = torch.compile(lambda x: torch.sigmoid(lin(x)) * x)
        f(torch.randn(2, 4, requires_grad=True)).sum().backward()
        with torch.no_grad():
            f(torch.randn(3, 4))
    torch._dynamo.reset()
    assert seen == ["forward", "backward", None]


# -- TorchTitan 0.2.2's real trainer, blocks compiled --------------------------------------------

class CompiledBlocksCpuTrainer(cpu_trainer.CpuTrainer):
    """CpuTrainer with its TransformerBlocks compiled by the model's own ``apply_compile``
    (what ``parallelize_fn`` does on a GPU, without FSDP), or eager with ``compiled=False``."""

    compiled = True

    def __init__(self, job_config: Any) -> None:
        super().__init__(job_config)
        if self.compiled:
            apply_compile = self.train_spec.parallelize_fn.__globals__["apply_compile"]
            apply_compile(self.model_parts[0], job_config.compile)


def _trainer(monkeypatch: pytest.MonkeyPatch, env: str | None, compiled: bool = True):
    cpu_trainer.cpu_patches(monkeypatch.setattr)
    monkeypatch.setattr(CompiledBlocksCpuTrainer, "patch_for_cpu", False)
    monkeypatch.setattr(CompiledBlocksCpuTrainer, "compiled", compiled)
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env)
    monkeypatch.setitem(cpu_trainer.TINY, "n_layers", N_LAYERS)
    args = ["--model.converters", "rocm"]
    if compiled:  # the blocks, and the loss (TorchTitan's [compile] components default)
        args += ["--compile.enable", "--compile.backend", "inductor"]
    trainer = CompiledBlocksCpuTrainer(cpu_trainer.job_config(args))
    if env is not None:
        corrupt.install(trainer.model_parts)  # as titan-rocm audit does, before any compile
    return trainer


def _grads(trainer: Any) -> tuple[float, dict[str, torch.Tensor]]:
    """One real ``forward_backward_step`` on the loader's first batch: loss, every gradient
    (by the parameter's name without compile wrappers)."""
    input_dict, labels = next(iter(cpu_trainer.SyntheticLoader(2, 32, 256, 1, seed=0)))
    model = trainer.model_parts[0]
    model.zero_grad(set_to_none=True)
    loss = trainer.forward_backward_step(
        input_dict=input_dict, labels=labels,
        global_valid_tokens=torch.tensor(float(labels.numel())))
    return loss.item(), {n.replace("._orig_mod", ""): p.grad.clone()
                         for n, p in model.named_parameters()}


def _changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    assert a.keys() == b.keys()
    return {n for n in a if not torch.equal(a[n], b[n])}


@pytest.fixture(scope="module")
def clean_compiled():
    """Gradients of the clean compiled run, and which backward-graph outputs every
    candidate node reaches (to pick a node that feeds one parameter gradient only)."""
    mp = pytest.MonkeyPatch()
    graphs: list[list[list[int]]] = []

    def analyse(graph: torch.fx.Graph) -> None:
        if corrupt.graph_kind(graph) != "backward":
            return
        outputs = list(next(n for n in graph.nodes if n.op == "output").args[0])
        reach = []
        for node in corrupt.candidate_nodes(graph, "mul"):
            seen, stack, hit = set(), [node], set()
            while stack:
                x = stack.pop()
                if x in seen:
                    continue
                seen.add(x)
                for user in x.users:
                    if user.op == "output":
                        hit.update(i for i, o in enumerate(outputs) if o is x)
                    else:
                        stack.append(user)
            reach.append(sorted(hit))
        graphs.append(reach)

    try:
        torch._dynamo.reset()
        with torch._inductor.config.patch(post_grad_custom_post_pass=analyse,
                                          compile_threads=1, fx_graph_cache=False):
            result = _grads(_trainer(mp, None))
    finally:
        mp.undo()
        torch._dynamo.reset()
    # The block input's gradient is the output most nodes reach (the whole input path feeds
    # it); a node that reaches one other output alone feeds one weight gradient only.
    reach = max(graphs, key=len)  # the blocks' graph (the compiled loss has one too)
    counts = collections.Counter(i for outs in reach for i in outs)
    input_grad = counts.most_common(1)[0][0]
    weight_only = next(i for i, outs in enumerate(reach) if outs and input_grad not in outs
                       and len(outs) == 1)
    return result, weight_only


def _corrupted_run(monkeypatch, env: str, compiled: bool = True):
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(compile_threads=1):
            trainer = _trainer(monkeypatch, env, compiled)
            return trainer, _grads(trainer)
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
def test_backward_corruption_changes_block_1_and_nothing_it_cannot_reach(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, clean_compiled,
) -> None:
    (clean_loss, clean), _ = clean_compiled
    with caplog.at_level(logging.INFO, "titan_rocm"):
        trainer, (loss, grads) = _corrupted_run(monkeypatch, f"block={BLOCK},fraction=0.03")
    assert loss == clean_loss  # a backward fault: the forward is untouched
    changed = _changed(clean, grads)
    # Block 1's backward runs after block 2's (and the norm and output's): those are
    # bit-identical; block 1 changed; its input gradient carries the error on into block 0
    # and the embedding, as a wrong kernel's would.
    assert {n for n in changed if n.startswith(f"layers.{BLOCK}.")}
    assert not {n for n in changed if n.startswith("layers.2.") or n.startswith(("norm", "out"))}
    hits = corrupt.summary()["hits"]
    # the three blocks share one graph, and the compiled loss's backward has a mul too: the
    # op ran four times and hit once, in block 1
    assert hits["hits"] == 1 and hits["calls"] == N_LAYERS + 1
    assert abs(hits["changed"] / hits["elements"] - 0.03) < 0.005
    active = [r for r in caplog.records if "TEST FAULT ACTIVE" in r.getMessage()]
    assert len(active) == 1 and f"{ENV}=block=1,graph=backward" in active[0].getMessage()
    with caplog.at_level(logging.INFO, "titan_rocm"):
        _grads(trainer)  # the model's second forward says what the first pass did
    assert caplog.text.count(f"{ENV} after the first forward and backward: corrupted block "
                             "1's compiled backward 1 time(s)") == 1

    # fraction 1 %, 3 %, 10 % of the node: the same compiled code, the op reads the spec
    for fraction in (0.01, 0.03, 0.10):
        corrupt.switch(CorruptSpec(block=BLOCK, fraction=fraction))
        _grads(trainer)
        hits = corrupt.summary()["hits"]
        assert hits["hits"] == 1
        assert abs(hits["changed"] / hits["elements"] - fraction) < max(0.2 * fraction, 0.002)



@pytest.mark.slow
def test_a_weight_gradient_node_changes_exactly_one_gradient_of_block_1(
    monkeypatch: pytest.MonkeyPatch, clean_compiled,
) -> None:
    (clean_loss, clean), weight_only = clean_compiled
    _, (loss, grads) = _corrupted_run(
        monkeypatch, f"block={BLOCK},index={weight_only},fraction=0.1")
    changed = _changed(clean, grads)
    assert len(changed) == 1 and next(iter(changed)).startswith(f"layers.{BLOCK}.")
    assert loss == clean_loss


@pytest.mark.slow
def test_forward_corruption_hits_block_1s_forward_once(
    monkeypatch: pytest.MonkeyPatch, clean_compiled,
) -> None:
    (clean_loss, _), _ = clean_compiled
    _, (loss, _) = _corrupted_run(monkeypatch, f"block={BLOCK},graph=forward,fraction=0.1")
    assert loss != clean_loss
    hits = corrupt.summary()["hits"]
    assert hits["hits"] == 1 and hits["calls"] >= N_LAYERS  # (and the loss's, if it has a mul)


@pytest.mark.slow
def test_eager_run_with_the_variable_set_is_bit_identical_to_a_clean_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    _, (clean_loss, clean) = _corrupted_run(monkeypatch, "", compiled=False)
    corrupt.uninstall()
    with caplog.at_level(logging.INFO, "titan_rocm"):
        _, (loss, grads) = _corrupted_run(monkeypatch, "block=1,fraction=0.5", compiled=False)
        corrupt.report("at exit")
    assert loss == clean_loss and _changed(clean, grads) == set()
    assert corrupt.summary()["hits"]["calls"] == 0
    assert "never matched: no compiled backward graph ran the op" in caplog.text
