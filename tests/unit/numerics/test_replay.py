"""Teacher-forced replays' pieces (titan_rocm/numerics/replay.py): which inputs can be cut
into runs of rows, and how a flex-attention mask is cut."""

from __future__ import annotations

import torch

from titan_rocm.numerics.record import BlockRecord
from titan_rocm.numerics.replay import cut, sliceable


def _record(*leaves: object) -> BlockRecord:
    return BlockRecord("0", torch.nn.Identity(), None, list(leaves),
                       [i == 0 for i in range(len(leaves))], None, [])


def test_which_inputs_can_be_cut_into_runs_of_rows() -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    hidden = torch.zeros(4, 8, 2)
    rope = torch.zeros(8, 3)  # no batch dimension: shared by every row
    positions = torch.zeros(4, 8, dtype=torch.long)
    assert sliceable(_record(hidden, rope, positions, None, True))
    cu_seqlens = torch.zeros(4, dtype=torch.int32)  # a folded batch's metadata: the rows'
    assert not sliceable(_record(hidden, cu_seqlens))
    assert not sliceable(_record(hidden, object()))
    causal = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 8, 8, device="cpu")
    assert sliceable(_record(hidden, causal))  # broadcast over the rows


def test_a_block_mask_is_cut_with_its_rows_own_batch_indices() -> None:
    """``BlockMask.__getitem__`` leaves a mask function that refuses to run; the cut mask's
    function sees each row's index in the whole batch, so per-document masks stay right."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch, seq = 4, 256
    documents = torch.randint(0, 3, (batch, seq), generator=torch.Generator().manual_seed(0))
    documents = documents.sort(dim=1).values

    def same_document(b, h, q, kv):  # noqa: ANN001, ANN202 - flex's mask_mod signature
        return (documents[b, q] == documents[b, kv]) & (q >= kv)

    mask = create_block_mask(same_document, batch, None, seq, seq, device="cpu")
    q, k, v = (torch.randn(batch, 2, seq, 16, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    whole = flex_attention(q, k, v, block_mask=mask)
    rows = cut(mask, (batch, seq), 1, 3)
    assert rows.kv_num_blocks.shape[0] == 2
    part = flex_attention(q[1:3], k[1:3], v[1:3], block_mask=rows)
    torch.testing.assert_close(part, whole[1:3])
    assert cut(mask, (batch, seq), 0, batch) is mask  # the whole batch: the mask itself


def test_the_reference_puts_the_memory_efficient_attention_kernel_first() -> None:
    """TorchTitan's attention modules keep ``sdpa_backends`` (cuDNN, flash, math) per
    instance; in float32 only math takes the inputs, so the reference asks for the
    memory-efficient kernel first while it runs, and puts the job's list back."""
    from torch.nn.attention import SDPBackend

    from titan_rocm.numerics.precision import efficient_attention

    attention = torch.nn.Module()
    job = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    attention.sdpa_backends = job
    model = torch.nn.Sequential(attention)
    with efficient_attention([model]):
        assert attention.sdpa_backends == [SDPBackend.EFFICIENT_ATTENTION, *job]
    assert attention.sdpa_backends is job


class _Attention(torch.nn.Module):
    """TorchTitan's SDPA module as both generations write it (0.2.2
    ``torchtitan/models/attention.py`` ``ScaledDotProductAttentionWrapper``, 0.3.0
    ``torchtitan/models/common/attention.py`` ``ScaledDotProductAttention``): an instance
    ``sdpa_backends`` and ``forward(q, k, v, *, scale, enable_gqa, is_causal)``."""

    def __init__(self) -> None:
        super().__init__()
        from torch.nn.attention import SDPBackend

        self.sdpa_backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                              SDPBackend.MATH]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                scale: float | None = None, enable_gqa: bool = False,
                is_causal: bool = True) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(self.sdpa_backends, set_priority=True):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa)


def test_the_reference_repeats_grouped_key_value_heads_for_the_efficient_kernel() -> None:
    """The memory-efficient kernel refuses ``enable_gqa`` (math then keeps every score): in
    the reference, the attention module repeats grouped heads to the query's and calls
    with ``enable_gqa`` off, with the same values and gradients, also where a checkpointed
    block is recomputed on another thread (the autograd engine's device thread, where a
    mode of the calling thread is not), and the module is as it was after."""
    import threading

    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils.checkpoint import checkpoint

    from titan_rocm.numerics.precision import efficient_attention

    seen: list[tuple[int, object]] = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                seen.append((args[1].shape[-3], kwargs.get("enable_gqa")))
            return func(*args, **kwargs)

    attention = _Attention()
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, 16, 4, generator=generator, requires_grad=True)
               for heads in (8, 2, 2))
    want = attention(q, k, v, enable_gqa=True)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    with efficient_attention([attention]):
        with Spy():
            got = checkpoint(lambda *t: attention(*t, enable_gqa=True), q, k, v,
                             use_reentrant=False)
        grads: list[tuple[torch.Tensor, ...]] = []
        backward = threading.Thread(target=lambda: grads.append(
            torch.autograd.grad(got.square().sum(), (q, k, v))))
        backward.start()
        backward.join()
    assert seen == [(8, False)]
    assert "forward" not in attention.__dict__
    torch.testing.assert_close(got, want)
    for g, w in zip(grads[0], want_grads, strict=True):
        torch.testing.assert_close(g, w)
