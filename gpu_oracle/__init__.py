"""Real kernels (CUDA C through CuPy, the same CUDA C on the CPU, torch) and differential checks against models/."""
