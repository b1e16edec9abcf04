"""DeepSeek MLA attention on aiter, each call routed by the device's real arch and the installed
aiter release, so q/k 192, v 128 never reaches a kernel the device lacks and v is never padded
(docs/mla-ck-backward.md)."""
