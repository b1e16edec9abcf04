"""The TorchTitan adapters, one folder per generation (tt022: converters over the
TOML JobConfig; tt030: config functions and Trainer.Config)."""
