"""Kernel families: one folder each with its CUDA C source, CPU launcher, Python backends and checks."""
