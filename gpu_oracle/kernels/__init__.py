"""Kernel families: one folder each with its CUDA C sources, CPU launchers, Python backends, the family descriptor
(`FAMILY` in its `__init__`) and its kernel properties."""
