"""A stub workaround that reaches into TorchTitan's code through a seam per generation."""
