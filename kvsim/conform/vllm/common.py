"""What vLLM's kernels need in a kernel child: the engine modules kvsim stands in for, and loading them once.

`vllm_modules(device)`: `vllm.triton_utils` (triton itself), `vllm.platforms.current_platform` (its fp8 dtype,
not ROCm), `vllm.utils.torch_utils.async_tensor_h2d` (a plain `torch.tensor`). Imported only in the child
(`kvsim.conform.triton_child`), where torch and triton are loaded under the interpreter.
"""

from __future__ import annotations

import types
from typing import Any

from ..loader import loaded_cache
from ..source import EngineSource


def vllm_modules(device: str) -> dict[str, Any]:
    import torch
    import triton
    import triton.language as tl

    class Platform:
        def fp8_dtype(self) -> Any:
            return torch.float8_e4m3fn

        def is_rocm(self) -> bool:  # kernels pick their CUDA tile sizes
            return False

    def async_tensor_h2d(data: Any, dtype: Any, target_device: Any = None, pin_memory: bool = False,
                         device: Any = None) -> Any:
        return torch.tensor(data, dtype=dtype, device=device or target_device)

    return {"vllm.triton_utils": types.SimpleNamespace(triton=triton, tl=tl),
            "vllm.platforms": types.SimpleNamespace(current_platform=Platform()),
            "vllm.utils.torch_utils": types.SimpleNamespace(async_tensor_h2d=async_tensor_h2d)}


_LOADED: dict[tuple[str, str, tuple[str, ...]], Any] = loaded_cache()


def load_in_child(source: EngineSource, relpath: str, names: tuple[str, ...], device: str) -> Any:
    from ..triton_child import load_upstream

    key = (str(source.root), relpath, tuple(names))  # a child serves several targets: each its own names
    if key not in _LOADED:
        _LOADED[key] = load_upstream(source, relpath, names, modules=vllm_modules(device))
    return _LOADED[key]


