"""The Triton interpreter's language patch, made once per launch instead of once per nested call.

Under `TRITON_INTERPRET=1` a launch (`GridExecutor.__call__`) patches `triton.language` (`_patch_lang`: every
builtin of `tl`, `tl.core`, `tl.math` and `tl.tensor` wrapped for the interpreter's semantic) and restores it when
the grid is done. Every call of a `@triton.jit` function from inside a kernel (`InterpretedFunction.__call__`)
patches the same modules again, and never restores that patch: `tl.cdiv`, `tl.max`, `tl.sum` and the other
standard-library functions are such functions, so a kernel pays the whole patch (about a millisecond) on each of
them, in each program of its grid; in a small softmax-like kernel that is a third of the launch.

`install()` (the kernel child calls it once triton's interpreter is imported) makes a nested call's patch only when
it patches a language module that no patch of the launch in force has patched yet, and skips it otherwise. A
launch patches the modules its kernel sees (`tl`); the standard library's functions see `tl.core`, a second module
object, which the first of them patches (and, as upstream, leaves patched). A skipped patch would only set the
same wrappers again on the same objects: the builtins it wraps are the wrappers already (it leaves those alone) and
its tensor and core members are the same closures over the same semantic. Outside a launch nothing changes. The
kernels, their inputs and their answers are the interpreter's own.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

_INSTALLED = "kvsim_patch_once"


def _languages(fn: Any, tl: Any) -> frozenset[int]:
    """The language modules `_patch_lang(fn)` would patch: those of `fn`'s globals that are `tl` or `tl.core`."""
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core))


def install() -> bool:
    """Patch the interpreter's `_patch_lang` (once per process); False when triton's interpreter is not loaded."""
    import sys

    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is None:
        return False
    original = interpreter._patch_lang
    if getattr(original, _INSTALLED, False):
        return True
    import triton.language as tl

    launches: list[set[int]] = []  # per launch in force (innermost last): the language modules patched in it
    entering: list[bool] = [False]  # a launch has begun and its own patch is the next `_patch_lang` call

    @functools.wraps(original)
    def patch_lang(fn: Any) -> Any:
        languages = _languages(fn, tl)
        if entering[0]:  # the launch's own patch: made, and remembered until the launch restores it
            entering[0] = False
            scope = original(fn)
            patched = set(languages)
            launches.append(patched)
            restore = scope.restore

            def restore_and_forget() -> None:
                restore()
                launches[:] = [p for p in launches if p is not patched]

            scope.restore = restore_and_forget
            return scope
        if launches and languages <= launches[-1]:
            return interpreter._LangPatchScope()  # this launch has patched these modules: nothing to undo
        if launches:
            launches[-1].update(languages)
        return original(fn)

    launch = interpreter.GridExecutor.__call__

    @functools.wraps(launch)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        entering[0] = True
        try:
            return launch(self, *args, **kwargs)
        finally:
            entering[0] = False

    setattr(patch_lang, _INSTALLED, True)
    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = call
    return True
