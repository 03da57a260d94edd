"""Shared helpers of the FlashInfer adapters: tensors, refusals that name a rule, reading the capability matrix.

`NamedRefusals` is the comparison of the validators (metadata, run contract): upstream raises `ValueError` (or
`TypeError`) with a message, the model refuses naming a rule; a raise equals the model's refusal only when its
message names the same rule (and, for a planned-run mismatch, the same planned and given values). The raise
stays the runner's answer (with where it was raised); only the comparison reads its message.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from kvsim.engine.conformance.answers import Raised, Refused
from kvsim.engine.conformance.compare import Difference, Exact
from kvsim.engine.errors import ConfigError

MLA = "flashinfer/mla/_batch_mla"
CAPS = f"{MLA}/_backends/_capabilities.py"
REFUSAL = "named refusal"  # the field of the model's refusal (`refuse`), read back by `NamedRefusals`


def int32(values: Sequence[int]) -> Any:
    import torch

    return torch.tensor(list(values), dtype=torch.int32)


def table(rows: Sequence[Sequence[int]], width: int) -> Any:
    import torch

    return torch.tensor([list(r) for r in rows], dtype=torch.int32).reshape(len(rows), width)


# -- refusals that name a rule ------------------------------------------------------------------------------

def refuse(name: str) -> None:
    """The model's refusal naming `name` (a rule, and for a mismatch what was planned and given)."""
    raise ConfigError(REFUSAL, "what the code under test accepts", name)


def refusal_name(refused: Refused) -> str | None:
    marker = f"{REFUSAL}: expected what the code under test accepts, got "
    if not refused.message.startswith(marker):
        return None
    return str(ast.literal_eval(refused.message[len(marker):]))


def rule_by_words(message: str, words: Sequence[tuple[str, str]]) -> str:
    """The rule whose wording `message` holds (the first in `words`), or "unrecognised: <message>"."""
    return next((rule for text, rule in words if text in message), f"unrecognised: {message}")


@dataclass(frozen=True)
class NamedRefusals(Exact):
    """Exact; a raise of the code under test of a `refusals` type equals the model's refusal (`refuse(name)`)
    when `name_of(message)` is the refusal's name; the first difference is then `refusal`."""

    name_of: Callable[[str], str] | None = None

    def difference(self, model: Any, upstream: Any) -> Difference | None:
        if isinstance(model, Refused) and isinstance(upstream, Raised) and upstream.origin == "upstream" \
                and upstream.type in self.refusals and self.name_of is not None:
            want, got = refusal_name(model), self.name_of(upstream.message)
            return None if want == got else Difference("refusal", want, got)
        return super().difference(model, upstream)


PLANNED = re.compile(r"mismatch: planned (.*), got (.*); re-plan")


def mismatch_name(rule: str, message: str) -> str:
    """A planned-run mismatch named with its values: `rule: planned X, got Y` (X, Y as upstream writes them)."""
    found = PLANNED.search(message)
    return f"{rule}: planned {found.group(1)}, got {found.group(2)}" if found else rule


# -- the capability matrix ----------------------------------------------------------------------------------

BACKEND_FILES = {
    "fa2": "fa2_backend.py", "fa3": "fa3_backend.py", "cutlass": "cutlass_backend.py", "cutile": "cutile_backend.py",
    "trtllm-gen": "trtllm_gen_backend.py", "xqa": "xqa_backend.py",
    "cute-dsl-monolithic": "cute_dsl_monolithic_backend.py",
    "cute-dsl-modular": "cute_dsl_modular_backend.py", "cute-dsl-rubin-mtp": "cute_dsl_rubin_mtp_backend.py",
}


def backend_file(backend: str) -> str:
    return f"{MLA}/_backends/{BACKEND_FILES[backend]}"


def _capability_call(source: Any, backend: str) -> tuple[ast.Call, dict[str, Any]]:
    """The `_plan_capabilities = ...(...)` call of a backend file, and the file's constant assignments."""
    relpath = backend_file(backend)
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


def upstream_capabilities(source: Any, caps_cls: type) -> dict[str, Any]:
    """Each backend's `_plan_capabilities`, built with the release's own `MLAPlanCapabilities` (`caps_cls`) from
    the literal arguments its backend file declares (the backend modules themselves need CUDA builds to run)."""
    import dataclasses

    found: dict[str, Any] = {}
    for backend in BACKEND_FILES:  # monolithic before rubin-mtp, which copies it
        call, constants = _capability_call(source, backend)
        kwargs = {kw.arg: _literal(kw.value, constants) for kw in call.keywords if kw.arg is not None}
        if getattr(call.func, "id", "") == "replace":  # `replace(<monolithic>._plan_capabilities, backend_name=...)`
            found[backend] = dataclasses.replace(found["cute-dsl-monolithic"], **kwargs)
        else:
            found[backend] = caps_cls(**kwargs)
    return found


def as_dict(record: Any) -> Mapping[str, Any]:
    import dataclasses

    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}

