"""The workarounds, one package (or module) each, in apply order in ``registry``; below the
TorchTitan adapters, so nothing here imports a TorchTitan config (docs/architecture.md)."""
