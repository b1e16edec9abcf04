"""DeepSeek MLA attention on aiter, each call routed by the device's real arch and the installed
aiter release; per-document (block_causal) masks through aiter's varlen kernels
(docs/mla-ck-backward.md).

The converter ``rocm.mla_ck_backward`` replaces each DeepSeek V3 block's
``attention.inner_attention`` (:mod:`~.module`); :mod:`~.routing` picks aiter's own dispatch or
its CK kernel per call, so q/k 192, v 128 is never mis-dispatched to a kernel the device
lacks, and v is never padded. :mod:`~.guard` routes other callers of aiter's backward the
same way; :mod:`~.seams_tt030` carries the same paths to TorchTitan 0.3.0 and main.
"""
