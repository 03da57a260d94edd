"""Shared helpers of the FlashInfer adapters: loading upstream definitions, tensors, reading the capability matrix."""

from __future__ import annotations

import ast
from types import SimpleNamespace
from typing import Any, Sequence

from kvsim.engine.errors import ConfigError

from ..loader import load_definitions
from ..source import EngineSource

MLA = "flashinfer/mla/_batch_mla"
FINDING = "finding confirmed"  # an open-upstream finding's property failing on the release, as the catalog says


def load(source: EngineSource, relpath: str, names: Sequence[str], **kw: Any) -> SimpleNamespace:
    return load_definitions(source.file(relpath), list(names), where=relpath, version=source.label, **kw)


def int32(values: Sequence[int]) -> Any:
    import torch

    return torch.tensor(list(values), dtype=torch.int32)


def table(rows: Sequence[Sequence[int]], width: int) -> Any:
    import torch

    return torch.tensor([list(r) for r in rows], dtype=torch.int32).reshape(len(rows), width)


BACKEND_FILES = {
    "fa2": "fa2_backend.py", "fa3": "fa3_backend.py", "cutlass": "cutlass_backend.py", "cutile": "cutile_backend.py",
    "trtllm-gen": "trtllm_gen_backend.py", "xqa": "xqa_backend.py",
    "cute-dsl-monolithic": "cute_dsl_monolithic_backend.py",
    "cute-dsl-modular": "cute_dsl_modular_backend.py", "cute-dsl-rubin-mtp": "cute_dsl_rubin_mtp_backend.py",
}


def _capability_call(source: EngineSource, backend: str) -> tuple[ast.Call, dict[str, Any]]:
    """The `_plan_capabilities = ...(...)` call of a backend file, and the file's constant assignments."""
    relpath = f"{MLA}/_backends/{BACKEND_FILES[backend]}"
    tree = ast.parse(source.file(relpath).read_text(encoding="utf-8"))
    constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_plan_capabilities" for t in targets) \
                    and isinstance(node.value, ast.Call):
                return node.value, constants
    raise ConfigError(f"{relpath}:_plan_capabilities", "a `_plan_capabilities = MLAPlanCapabilities(...)` assignment",
                      f"absent in {source.label}")


def _literal(node: ast.expr, constants: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    return eval(compile(ast.Expression(node), "<capabilities>", "eval"),  # noqa: S307 - literals and frozenset only
                {"__builtins__": {}, "frozenset": frozenset, "True": True, "False": False})


def upstream_capabilities(source: EngineSource) -> dict[str, Any]:
    """Each backend's `_plan_capabilities`, built with the release's own `MLAPlanCapabilities` from the literal
    arguments its backend file declares (the backend modules themselves need CUDA builds to import)."""
    import dataclasses

    caps_cls = load(source, f"{MLA}/_backends/_capabilities.py", ["MLAPlanCapabilities"]).MLAPlanCapabilities
    found: dict[str, Any] = {}
    for backend in BACKEND_FILES:  # monolithic before rubin-mtp, which copies it
        call, constants = _capability_call(source, backend)
        kwargs = {kw.arg: _literal(kw.value, constants) for kw in call.keywords if kw.arg is not None}
        if getattr(call.func, "id", "") == "replace":  # `replace(<monolithic>._plan_capabilities, backend_name=...)`
            found[backend] = dataclasses.replace(found["cute-dsl-monolithic"], **kwargs)
        else:
            found[backend] = caps_cls(**kwargs)
    return found
