"""The oracle runtime, written once for every kernel family: the family descriptor (`family`), the g++ build
of a CUDA C kernel for the CPU (`build`, `shim`), the AddressSanitizer child (`asan`, `asan_run`) and the
discovery of the backends this machine can run (`discovery`)."""
