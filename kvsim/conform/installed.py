"""The second load mode: a released engine imported for real, in a child process, from the user cache.

`loader.py` reads named definitions out of an engine's files without importing the engine. A whole component
(vLLM's `KVCacheManager` with its block pool, coordinator and request type) is driven by importing the
release instead: its unpacked tree (`source.resolve_source`) first on `sys.path`, and a per-release folder of
the dependencies its import chain needs last, installed `pip install --no-deps --target` from the pins below.
Torch is never installed there: it is the running interpreter's (the CPU build), and `--no-deps` keeps every
pin from pulling a CUDA torch or nvidia packages. Nothing is written into the repository.

`DEPENDENCIES` is the one place that says what an import needs: per engine, a table of pinned distributions
for each release (`"default"` for the releases without their own). The vLLM table was found by importing
`vllm.v1.core.kv_cache_manager` from the 0.33.0 tree and adding each distribution a `ModuleNotFoundError`
named, then keeping those whose modules the import loaded; 0.26.0 imports with the same table (its metadata
pins apache-tvm-ffi 0.1.10, and 0.1.11 loads for the import). einops was added the same way for the scheduler's
P/D path (NIXL's connector from 0.26.0, and 0.30.0's scheduler module itself); the manager never loads it, and it
is in the default table since every release from 0.26.0 needs it there. vLLM's import chain runs as released (it
only warns that its package metadata is missing, as it does from any unpacked tree).

The SGLang table (0.5.23's `sglang.srt.mem_cache.radix_cache`, with the paged allocator beside it) was found the
same way, taking the version the release's own metadata pins where it pins one (transformers, tokenizers,
sentencepiece, compressed-tensors, apache-tvm-ffi). Its chain loads every model config (transformers) and the
quantization layers, through `memory_pool`. Two modules it imports cannot load from an unpacked tree on a CPU and
are stubbed in the child before the import, both listed in `STUBS` with why; the checked path calls neither.
0.5.13 to 0.5.16 have their own pins (transformers 5.8.1 or 5.12.1 and what it wants) and stubs (`stubs`);
0.5.13 and 0.5.14's batch allocation runs only as Triton kernels, in Triton's interpreter (`CHILD_ENVIRONMENT`).

`prepare(engine, version)` installs the folder once (a marker file names the pins it holds; processes that
prepare the same release at once take turns on a lock file, and pip installs into a private folder renamed
into place), and returns the `ImportEnvironment` the child (`installed_child`) starts from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from kvsim.engine.errors import ConfigError, KvsimError

from .source import EngineSource, cache_root, check_version, made_once, resolve_source

INSTALL_TIMEOUT_S = 1800
MARKER = ".kvsim-prepared"

# vllm.v1.core.kv_cache_manager's import chain (vllm.distributed.kv_events, kv_cache_utils, vllm.config,
# vllm.v1.request and its structured-output and entrypoint imports) and the scheduler's, distribution==version.
# Numpy, pyzmq, psutil, pyyaml, requests, filelock and pillow come from kvsim's own environment, torch from the
# interpreter.
_VLLM = (
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "annotated-doc==0.0.7",
    "annotated-types==0.8.0", "anyio==4.16.0", "apache-tvm-ffi==0.1.11", "cachetools==8.0.2", "cbor2==6.3.0",
    "cloudpickle==3.1.3", "fastapi==0.136.3", "frozenlist==1.8.0", "h11==0.16.0", "httpcore2==2.16.2",
    "httpx2==2.16.2", "huggingface-hub==2.4.0", "llguidance==1.7.6", "msgspec==0.23.0", "multidict==7.2.1",
    "openai==3.60.0", "openai-harmony==0.0.8", "partial-json-parser==0.2.1.1.post7", "prometheus-client==0.26.0",
    "propcache==0.5.4", "py-cpuinfo==9.0.0", "pybase64==1.5.1", "pydantic==2.14.4", "pydantic-core==2.50.5",
    "regex==2026.11.19", "safetensors==0.8.0", "sniffio==1.3.1", "starlette==1.10.0", "tokenizers==0.23.3",
    "tqdm==4.70.1", "transformers==5.20.2", "truststore==0.10.5", "typing-inspection==0.4.5", "uvloop==0.23.0",
    "xgrammar==0.2.8", "yarl==1.25.1",
    # not the manager's: NIXL's connector (its worker module loads the attention layers, whose ViT wrappers import
    # einops; 0.26.0 on) and 0.30.0's scheduler itself (fused_moe -> model utilities -> the model loader -> the same)
    "einops==0.8.2",
)

# sglang.srt.mem_cache.radix_cache's import chain (0.5.23): base_prefix_cache -> memory_pool -> srt.configs (every
# model config: transformers, sentencepiece, gguf) and srt.layers.quantization (compressed-tensors), the server
# args and utilities (aiohttp, pydantic, starlette, orjson, msgspec, pybase64, dill, loguru, tvm_ffi); the request
# ops' `schedule_batch` adds the OpenAI protocol (openai, distro, httpx, partial-json-parser).
_SGLANG = (
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "annotated-types==0.8.0", "anyio==4.16.0",
    "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0", "dill==0.4.1", "distro==1.9.0", "frozenlist==1.8.0",
    "gguf==0.19.0", "h11==0.16.0", "httpcore2==2.17.0", "httpx==0.29.0", "httpx2==2.17.0", "huggingface-hub==2.4.0",
    "loguru==0.7.3", "msgspec==0.23.0", "multidict==7.2.1", "openai==2.8.0", "orjson==3.13.0",
    "partial-json-parser==0.2.1.1.post7", "propcache==0.5.4", "pybase64==1.5.1",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "regex==2026.12.2", "safetensors==0.8.0", "sentencepiece==0.2.1",
    "sniffio==1.3.1", "starlette==1.10.0", "tokenizers==0.23.2", "tqdm==4.70.1", "transformers==5.19.0",
    "truststore==0.10.5", "typing-inspection==0.4.5", "yarl==1.25.1",
)

# 0.5.13 and 0.5.14 (both pin transformers 5.8.1, which wants tokenizers <= 0.23.0 and huggingface-hub < 2, whose
# client is httpx; apache-tvm-ffi and openai as their metadata pins them; einops for the MoE runner's deep_gemm)
_SGLANG_0_5_14 = tuple(sorted(
    [p for p in _SGLANG if p.split("==")[0] not in ("apache-tvm-ffi", "huggingface-hub", "openai", "tokenizers",
                                                    "transformers")]
    + ["apache-tvm-ffi==0.1.9", "einops==0.8.2", "httpcore==1.0.9", "huggingface-hub==1.33.0", "openai==2.6.1",
       "tokenizers==0.22.2", "transformers==5.8.1"]))

# 0.5.15: 0.5.14's table with the transformers (5.12.1) and apache-tvm-ffi (0.1.11) it pins; 0.5.16 adds xgrammar
# (a function-call detector the server arguments import)
_SGLANG_0_5_15 = tuple(sorted([p for p in _SGLANG_0_5_14 if p.split("==")[0] not in ("apache-tvm-ffi", "transformers")]
                              + ["apache-tvm-ffi==0.1.11", "transformers==5.12.1"]))
_SGLANG_0_5_16 = tuple(sorted(_SGLANG_0_5_15 + ("xgrammar==0.2.1",)))

DEPENDENCIES: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "vllm": {"default": _VLLM},
    "sglang": {"default": _SGLANG, "0.5.13": _SGLANG_0_5_14, "0.5.14": _SGLANG_0_5_14, "0.5.15": _SGLANG_0_5_15,
               "0.5.16": _SGLANG_0_5_16},
}
# the module a child imports before it answers anything: the component the checks drive
CHECKED_MODULES: Mapping[str, str] = {"vllm": "vllm.v1.core.kv_cache_manager",
                                      "sglang": "sglang.srt.mem_cache.radix_cache"}
# what the child imports after it, where the release has it, before any driver's process is forked from it: what
# more than one driver would import on first use, each in its own process. SGLang's radix driver (the scheduler's
# `Req`) and its unified-SWA driver (`unified_radix_cache`) both load `schedule_batch` and the OpenAI protocol
# under it, about 700 modules, 1.1 s a driver. A module that does not import here is left to the driver (its
# error is the driver's, as before).
PRELOADED: Mapping[str, tuple[str, ...]] = {"sglang": ("sglang.srt.managers.schedule_batch",
                                                       "sglang.srt.mem_cache.unified_radix_cache")}


@dataclass(frozen=True)
class Stub:
    """What the child puts in place before the import. `kind`: "jit-paths" (a module with the JIT compiler's path
    constants pointing into the release tree, no check made), "jit-dirs" (the empty `include/` and `csrc/` the
    package's path check wants, made in it in the cached tree: the check itself runs as released), "absent" (the
    package and every submodule resolve to empty placeholders, after transformers was asked whether it is
    installed: it then never imports it) or "placeholder" (the same, with transformers left to import it)."""

    module: str
    kind: str
    reason: str


_TORCHVISION = ("the PyPI wheels are CUDA builds that fail against the CPU torch (torchvision::nms); only model "
                "configs and multimodal processors import it")
# 0.5.13-0.5.16: the same path check inside a module much else imports from; janus_pro registers an image
# processor, which their transformers (5.8.1, 5.12.1) refuses unless torchvision looks installed
_JIT_DIRS = Stub("sglang.jit_kernel", "jit-dirs",
                 "its path check (jit_kernel/utils.py; 0.5.16: jit_kernel/utils/compile.py) raises at import unless "
                 "the package holds include/ and csrc/ (not in the wheel's Python files)")
_STUBS_0_5_14 = (_JIT_DIRS, Stub("torchvision", "placeholder", _TORCHVISION))
# the one list of what is not imported as released, per engine and release as `DEPENDENCIES`; the checked path
# (the radix tree, the paged allocator) calls none of it
STUBS: Mapping[str, Mapping[str, tuple[Stub, ...]]] = {
    "sglang": {
        "default": (
            Stub("sglang.kernels.jit.utils.compile.paths", "jit-paths",
                 "raises at import unless include/ and csrc/ sit beside kernels/jit (they are not in the wheel's "
                 "Python files we unpack); only the JIT kernel compiler reads its paths"),
            Stub("torchvision", "absent", _TORCHVISION),
        ),
        "0.5.13": _STUBS_0_5_14,
        "0.5.14": _STUBS_0_5_14,
        "0.5.15": _STUBS_0_5_14,
        "0.5.16": _STUBS_0_5_14,
    },
}


# variables a child of the engine starts with: SGLang before 0.5.23 allocates a batch's slots with Triton kernels
# only (`alloc_extend_kernel`, `alloc_decode_kernel`), which run on CPU tensors in Triton's interpreter (read when
# triton is imported); 0.5.23 takes its torch path on a CPU and never launches them
CHILD_ENVIRONMENT: Mapping[str, Mapping[str, str]] = {"sglang": {"TRITON_INTERPRET": "1"}}

# never in a dependency folder: the interpreter's own torch and nothing built for CUDA
FORBIDDEN = ("torch", "torchvision", "torchaudio", "triton", "nvidia-")


def stubs(engine: str, version: str) -> tuple[Stub, ...]:
    """The stubs the import of `engine` `version` needs (none for an engine without a table)."""
    table = STUBS.get(engine, {})
    return table.get(version, table.get("default", ()))


@dataclass(frozen=True)
class ImportEnvironment:
    """What a real-import child puts on `sys.path`: the release tree first, its dependency folder last."""

    source: EngineSource
    deps: Path
    pins: tuple[str, ...]

    @property
    def engine(self) -> str:
        return self.source.engine

    @property
    def module(self) -> str:
        return CHECKED_MODULES[self.source.engine]

    @property
    def preloaded(self) -> tuple[str, ...]:
        return PRELOADED.get(self.source.engine, ())


def pins(engine: str, version: str) -> tuple[str, ...]:
    """The pinned distributions the import of `engine` `version` needs (ConfigError for an engine without a table)."""
    table = DEPENDENCIES.get(engine)
    if table is None:
        raise ConfigError("engine", f"an engine with a real-import table ({', '.join(DEPENDENCIES)})", engine)
    return table.get(version, table["default"])


def deps_folder(engine: str, version: str, pinned: tuple[str, ...]) -> Path:
    """`<cache>/deps/<engine>-<version>-<digest of the pins>`: a changed table is a new folder, never a stale one."""
    digest = hashlib.sha256("\n".join(sorted(pinned)).encode()).hexdigest()[:12]
    return cache_root() / "deps" / f"{engine}-{version}-{digest}"


def prepare(engine: str, version: str) -> ImportEnvironment:
    """The release's tree and its dependency folder, downloaded and installed once (later calls only look)."""
    version = check_version(version)
    pinned = pins(engine, version)
    source = resolve_source(engine, version=version)
    return ImportEnvironment(source, install_dependencies(engine, version), pinned)


def install_dependencies(engine: str, version: str) -> Path:
    """The release's dependency folder, installed once from its pins (a KvsimError with pip's reason if not)."""
    pinned = pins(engine, check_version(version))
    folder = deps_folder(engine, version, pinned)
    bad = [p for p in pinned if p.lower().startswith(FORBIDDEN)]
    if bad:
        raise ConfigError("dependency table", "no torch, triton or nvidia distribution", ", ".join(bad))
    return made_once(folder.parent, f".{folder.name}.lock", lambda: folder if (folder / MARKER).is_file() else None,
                     lambda scratch: _install(pinned, scratch, folder), prefix=f".{folder.name}.")


def _install(pinned: tuple[str, ...], tmp: Path, folder: Path) -> Path:
    """`pinned` installed into `tmp` with its marker, then renamed to `folder`."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--no-compile",
           "--disable-pip-version-check", "-q", "--target", str(tmp), *pinned]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KvsimError(f"installing the import dependencies into {folder} failed: {exc}") from exc
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines()
                 if line.strip() and not line.lstrip().startswith("WARNING")]
        reason = " ".join(" ".join(lines[-3:]).split()) or "no output"
        raise KvsimError(f"installing the import dependencies with pip failed (exit {done.returncode}): {reason}")
    (tmp / MARKER).write_text("\n".join(pinned) + "\n")
    if folder.exists():  # a folder left without its marker by an interrupted run
        shutil.rmtree(folder)
    os.rename(tmp, folder)
    return folder
