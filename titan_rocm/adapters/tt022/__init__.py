"""TorchTitan 0.2.2's adapter: converters, the [rocm] JobConfig extension, the
launcher, the plan and the start-up checks."""
