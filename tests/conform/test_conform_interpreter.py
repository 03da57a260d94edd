"""The Triton interpreter's language patch made once per launch (`kvsim.conform.interpreter`): same answers.

A kernel whose programs call the standard library (`tl.cdiv`, `tl.max`, `tl.sum`) and a `@triton.jit` helper of its
own runs twice under `TRITON_INTERPRET=1` in a fresh interpreter as upstream has it, and twice in another after
`install()`: the outputs are the same bits, the language modules are left in the same state (each attribute of `tl`, `tl.core`, `tl.math` and
`tl.tensor` the original object or a replacement alike), and the interpreter patched the language twice a launch
(its own patch and the standard library's `tl.core`) instead of once per nested call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def helper(x):
    return tl.maximum(x, 0.0) + tl.cdiv(7, 2)


@triton.jit
def kernel(X, Y, N: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, tl.cdiv(N, BLOCK)):
        offs = s * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + pid * N + offs, mask=offs < N, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        acc += helper(e / tl.sum(e, axis=0))
    tl.store(Y + pid * BLOCK + tl.arange(0, BLOCK), acc)
'''

DRIVER = '''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import torch
import triton.language as tl
from triton.runtime import interpreter
from kvsim.conform.interpreter import install
from planted_kernel import kernel

patches = [0]
original = interpreter._patch_lang


def counted(fn):
    patches[0] += 1
    return original(fn)


interpreter._patch_lang = counted
objects = {name: dict(vars(m)) for name, m in (("tl", tl), ("core", tl.core), ("math", tl.math), ("tensor", tl.tensor))}


def state():
    live = (("tl", tl), ("core", tl.core), ("math", tl.math), ("tensor", tl.tensor))
    return {name: sorted(k for k, v in vars(m).items() if objects[name].get(k) is not v) for name, m in live}


def launch():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    y = torch.empty(4, 16)
    before = patches[0]
    kernel[(4,)](x, y, 64, 16)
    return y.numpy().tobytes().hex(), patches[0] - before, state()


if sys.argv[2] == "once":
    install()
    install()  # a second install changes nothing
print(json.dumps([launch(), launch()]))
'''


def test_the_language_is_patched_once_a_launch_with_the_same_answers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "planted_kernel.py").write_text(textwrap.dedent(KERNEL))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = {}
    for mode in ("plain", "once"):  # each in a fresh process: a patch upstream leaves in force would hide a gap
        done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), mode], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[mode] = json.loads(done.stdout)
    plain = runs["plain"]
    assert plain[0][0] == plain[1][0]  # upstream's own launches repeat their bits: the comparison below is fair
    for (bits, patches, state), (plain_bits, _, plain_state) in zip(runs["once"], plain):
        assert bits == plain_bits
        assert state == plain_state
        assert patches == 2  # the launch's own patch and the first nested call's tl.core
    assert min(p for _, p, _ in plain) > 10 * 2  # upstream patched again on every nested call of every program
