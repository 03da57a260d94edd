"""Kernel targets: what the adapters of real upstream Triton kernels share.

A kernel target is a `Differential` with `kernel=True` (`kvsim.engine.conformance.adapters`): the engine's
runner starts one child for it (`kvsim.conform.triton_child`), and the adapter's upstream side sends each case
there with `call_kernel`; the child-side runner (a function beside the adapter, named "module:function") loads
the kernel from the source and runs it. A raise, a death or a hang of the kernel is that call's answer.
`kernel_examples()` caps a kernel target's examples (each is one interpreted launch); `unpacked` reads an array
the child sent back.
"""

from __future__ import annotations

from typing import Any, Mapping

DEFAULT_EXAMPLES = 40  # budget per kernel target unless KVSIM_PROFILE=dev (one interpreted launch each)
DEV_EXAMPLES = 200  # KVSIM_PROFILE=dev


def kernel_examples() -> int:
    """A kernel target's cap on examples: each is one interpreted launch (`Differential(examples=...)`)."""
    import os

    return DEV_EXAMPLES if os.environ.get("KVSIM_PROFILE") == "dev" else DEFAULT_EXAMPLES


def call_kernel(ctx: Any, runner: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """One launch of the upstream kernel in the target's child: `runner` is "kvsim.conform.<engine>.<module>:
    <function>", the child-side function that loads the kernel and runs `document`; a raise, death or hang of
    the kernel reaches the runner as that call's answer."""
    return ctx.child.call(runner, document)


def unpacked(result: Mapping[str, Any], key: str) -> Any:
    from kvsim.gpu_oracle.runtime.asan import unpack

    return unpack(result[key])
