"""SGLang's PD staging kernels as conform targets: the head-slice gather and the slot scatter, four differentials.

`GATHER_TRITON`, `GATHER_TORCH`, `SCATTER_TRITON`, `SCATTER_TORCH` (`Differential(kernel=True)`, at most
`kernel_examples()` cases each): the release's launcher runs in the kernel child (`run_gather` / `run_scatter`,
named "kvsim.conform.sglang.kernels:run_gather"), the model here, on the same arrays (made once per case). The
answers: the whole staging buffer (gather: every byte, and the bytes the launcher says it wrote, with the KV
dtype) or the whole decode pool (scatter: every byte); compared exactly (`QuietedNaN` for the gather: the torch
path's documented tolerance below). Checked: the dispatcher, the path's launcher and its kernel (or the torch
path's head-slice helper); the dispatcher's other branch is the other target's.

* `staging-gather-triton` / `staging-gather-torch`: `gather_all_layers_to_staging`
  (python/sglang/srt/disaggregation/common/staging_buffer.py) dispatching to the fused Triton
  kernel `_fused_gather_to_staging_kernel` or to the torch.gather fallback, against
  `kvsim.models.pd_staging.copy.gather_head_slice_to_staging`, bit for bit over the whole staging
  buffer (garbage outside the writer's region included), on `gpu_oracle.kernels.staging`'s copy
  cases (every writer of every decode rank of eight TP pairings, any page list, four dtypes).
  Adapter: per-layer K/V buffers are the model pool's `[L, 2, P, ps, H, D]` views reshaped
  `[P * ps, H, D]`; the `StagingBuffer` is a stand-in whose `buffer` starts at the writer's offset
  (upstream writes from the buffer's first byte); streams and `set_device` are no-ops on CPU;
  `make_ptr_table` is loaded from the release's own ptr_table.py; upstream views the staging buffer
  as elements, so an explicit writer offset of a case is rounded down to a multiple of the element
  size (a byte-odd offset cannot be viewed as int16: upstream's allocator never makes one).
  Tolerated (torch path only): torch's CPU `gather` of the strided head slice converts elements,
  turning a signalling NaN payload into the same quiet NaN (0xFC01 -> 0xFE01 in float16); a
  byte difference that is exactly that is accepted, any other is a divergence. The Triton path
  copies integers and is bit-exact; on CUDA (`--device cuda`) gpu_check reports whether torch is.
* `staging-scatter-triton` / `staging-scatter-torch`: `scatter_staging_to_kv` (Triton
  `_fused_scatter_from_staging_kernel` or the torch fallback), against the model's
  `scatter_staging_to_pages` applied for every writer of the decode rank at its slot offset, bit
  for bit over the whole decode pool. Adapter: upstream scatters the whole slot of one decode rank
  in one call (its writers at `writer * per_rank_bytes`), so a case's single `writer`/`offset` are
  not read: the slot is the case's garbage buffer, laid out by the model's `StagingLayout`.
  Before 0.5.23 (0.5.13-0.5.19: the same file, no `ptr_table.py`): the launchers build their layer
  pointer tables with `torch.tensor` themselves, and the gather takes a `gpu_id` and hard-codes
  `cuda:{gpu_id}` streams and devices. Adapter (CPU only): the loaded code's `torch` is the real one but
  for `torch.cuda` (a no-op device/stream shim), `gpu_id` is 0 and a torch function mode maps a
  `cuda:N` device argument to the CPU (`--device cuda` runs the release's code unchanged).
  Deliberate refusal (documented convention, probe `triton_staging_8_byte_elements`): upstream's
  Triton paths view the buffers through `{1: int8, 2: int16, 4: int32}.get(size, int16)`, so an
  8-byte KV dtype (float64) is copied as int16 with element offsets: a quarter of the bytes,
  misplaced, and no error. No SGLang KV cache is 8-byte, so the Triton targets draw 1/2/4-byte
  dtypes only and the probe checks that upstream still mis-copies float64 (an "open upstream"
  candidate: an assert would be better than silent corruption); the torch fallback takes all four.
"""

from __future__ import annotations

import ast
import contextlib
import types
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from kvsim.engine.conformance.adapters import Context, Differential, Probe
from kvsim.engine.conformance.answers import FAILED, capture
from kvsim.engine.conformance.compare import EXACT, Exact

from ..kernels import call_kernel, kernel_examples, unpacked
from ..loader import loaded_cache
from ..source import EngineSource

STAGING = "sglang/srt/disaggregation/common/staging_buffer.py"
PTR_TABLE = "sglang/kernels/ops/memory/ptr_table.py"
GATHER_SYMBOLS = ("gather_all_layers_to_staging", "_gather_all_layers_triton", "_gather_all_layers_torch",
                  "_fused_gather_to_staging_kernel")
SCATTER_SYMBOLS = ("scatter_staging_to_kv", "_scatter_staging_to_kv_triton", "_scatter_staging_to_kv_torch",
                   "_fused_scatter_from_staging_kernel", "compute_head_slice_params")
PATHS = ("triton", "torch")
TRITON_DTYPES = ("float16", "uint8", "float32")  # element sizes upstream's int view map covers


# --- child side ---------------------------------------------------------------------------------------

_LOADED: dict[str, Any] = loaded_cache()


class _CudaShim:
    """`torch.cuda` for a pre-0.5.23 launcher on the CPU: devices and streams are no-ops."""

    @staticmethod
    def set_device(index: Any) -> None:
        pass

    @staticmethod
    def Stream(*args: Any, **kwargs: Any) -> "_Stream":  # noqa: N802 - torch's name
        return _Stream()

    @staticmethod
    def default_stream(*args: Any, **kwargs: Any) -> "_Stream":
        return _Stream()

    current_stream = default_stream

    @staticmethod
    def stream(stream: Any) -> Any:
        return contextlib.nullcontext()


def _host_torch() -> types.ModuleType:
    import torch

    host = types.ModuleType("torch")
    host.__dict__.update({k: v for k, v in vars(torch).items() if not k.startswith("__")})
    host.cuda = _CudaShim()  # type: ignore[attr-defined]
    return host


def _on_cpu() -> Any:
    """A torch function mode mapping `cuda[:N]` device arguments to the CPU (the pre-0.5.23 gather's
    `cuda:{gpu_id}`)."""
    import torch
    from torch.overrides import TorchFunctionMode

    def host(value: Any) -> Any:
        if isinstance(value, str) and value.startswith("cuda"):
            return "cpu"
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device("cpu")
        return value

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*(host(a) for a in args), **{k: host(v) for k, v in (kwargs or {}).items()})

    return CudaOnCpu()


def _pre_ptr_table(source: EngineSource) -> bool:
    """The launchers of 0.5.13-0.5.22: the gather takes a trailing `gpu_id` and builds its own pointer table on
    `cuda:{gpu_id}` (0.5.20-0.5.22 ship `ptr_table.py` but their staging launchers do not use it yet)."""
    if not source.has(PTR_TABLE):
        return True
    tree = ast.parse(source.file(STAGING).read_text(encoding="utf-8"))
    gather = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "gather_all_layers_to_staging"),
                  None)
    return gather is not None and "gpu_id" in [a.arg for a in gather.args.args]


def _load(source: EngineSource, device: str) -> Any:
    import torch

    from ..triton_child import load_upstream

    key = str(source.root)
    if key not in _LOADED and _pre_ptr_table(source):
        extra = {"torch": _host_torch()} if device != "cuda" else {}
        _LOADED[key] = load_upstream(source, STAGING, tuple(dict.fromkeys(GATHER_SYMBOLS + SCATTER_SYMBOLS)),
                                     extra_globals=extra)
    if key not in _LOADED:
        ptr = load_upstream(source, PTR_TABLE, ("make_ptr_table",))
        if device == "cuda":
            stream_context = torch.cuda.stream
        else:
            def stream_context(stream: Any) -> Any:
                return contextlib.nullcontext()
        modules = {"sglang.kernels.ops.memory.ptr_table": types.SimpleNamespace(make_ptr_table=ptr.make_ptr_table),
                   "sglang.srt.utils": types.SimpleNamespace(device_stream_context=stream_context,
                                                             create_device_stream=lambda *a, **k: None)}
        _LOADED[key] = load_upstream(source, STAGING, tuple(dict.fromkeys(GATHER_SYMBOLS + SCATTER_SYMBOLS)),
                                     modules=modules)
    return _LOADED[key]


def _use(ns: Any, path: str) -> None:
    ns.gather_all_layers_to_staging.__globals__["_USE_TRITON_STAGING"] = path == "triton"


class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _tensor(array: np.ndarray, device: str) -> Any:
    """`array` as a torch tensor on `device` (an empty array gets real strides, not from_numpy's 0)."""
    import torch

    if array.size == 0:
        return torch.from_numpy(np.zeros(1, dtype=array.dtype))[:0].reshape(array.shape).to(device)
    return torch.from_numpy(array).to(device)


def _layers(pool: Any) -> tuple[list[Any], list[Any]]:
    num_layers, _, pages, page_size, heads, dim = pool.shape
    flat = [[pool[layer, kv].reshape(pages * page_size, heads, dim) for layer in range(num_layers)] for kv in (0, 1)]
    return flat[0], flat[1]


def run_gather(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    ns = _load(source, device)
    _use(ns, case["path"])
    pool = _tensor(unpack(case["pool"]), device)
    staging = _tensor(unpack(case["staging"]), device)
    k, v = _layers(pool)
    on_cuda = device == "cuda"
    stream = torch.cuda.current_stream() if on_cuda else _Stream()
    buffer = types.SimpleNamespace(buffer=staging[case["offset"]:], device=staging.device,
                                   device_module=torch.cuda if on_cuda else
                                   types.SimpleNamespace(set_device=lambda i: None),
                                   get_gather_stream=lambda: stream, producer_stream=lambda: stream)
    args = (k, v, np.asarray(case["pages"], dtype=np.int64), buffer, case["head_start"], case["num_heads"],
            pool.shape[3])
    if _pre_ptr_table(source):  # 0.5.13-0.5.22: a trailing gpu_id, and cuda:{gpu_id} devices
        with contextlib.nullcontext() if on_cuda else _on_cpu():
            written = ns.gather_all_layers_to_staging(*args, 0)
    else:
        written = ns.gather_all_layers_to_staging(*args)
    if on_cuda:
        torch.cuda.synchronize()
    return {"staging": pack(staging.cpu().numpy()), "written": int(written)}


def run_scatter(source: EngineSource, case: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    from kvsim.gpu_oracle.runtime.asan import pack, unpack

    ns = _load(source, device)
    _use(ns, case["path"])
    pool = _tensor(unpack(case["pool"]), device)
    staging = _tensor(unpack(case["staging"]), device)
    k, v = _layers(pool)
    heads, prefill_tp, decode_tp = case["reshard"]
    ns.scatter_staging_to_kv.__globals__["_USE_TRITON_STAGING"] = case["path"] == "triton"
    ns.scatter_staging_to_kv(staging, k, v, torch.tensor(case["pages"], dtype=torch.int64, device=device),
                             pool.shape[3], prefill_tp, decode_tp, case["rank"], heads)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"pool": pack(pool.cpu().numpy())}


# --- parent side --------------------------------------------------------------------------------------

GATHER_RUNNER = "kvsim.conform.sglang.kernels:run_gather"
SCATTER_RUNNER = "kvsim.conform.sglang.kernels:run_scatter"
QUIET_BITS = {"float16": 1 << 9, "float32": 1 << 22, "float64": 1 << 51}
EXPONENT_BITS = {"float16": 0x7C00, "float32": 0x7F800000, "float64": 0x7FF0000000000000}


def unquieted(want: np.ndarray, got: np.ndarray, dtype: Any) -> np.ndarray:
    """`got` with every element that is exactly `want`'s signalling NaN made quiet put back to `want`'s bits
    (torch's CPU gather of a strided float source converts, quieting sNaN payloads: documented, tolerated)."""
    name = np.dtype(dtype).name
    if name not in QUIET_BITS or want.shape != got.shape:
        return got
    size = np.dtype(dtype).itemsize
    usable = len(want) - len(want) % size
    unsigned = np.dtype(f"u{size}")
    w, g = want[:usable].view(unsigned), got[:usable].copy().view(unsigned)
    quiet, exponent = unsigned.type(QUIET_BITS[name]), unsigned.type(EXPONENT_BITS[name])
    mantissa = unsigned.type(EXPONENT_BITS[name] - 1) & ~exponent & unsigned.type((1 << (8 * size - 1)) - 1)
    signalling = ((w & exponent) == exponent) & ((w & mantissa) != 0) & ((w & quiet) == 0)
    fixed = signalling & (g == (w | quiet))
    g[fixed] = w[fixed]
    out = got.copy()
    out[:usable] = g.view(np.uint8)
    return out


@dataclass(frozen=True)
class QuietedNaN(Exact):
    """Byte for byte, except that an element of upstream's staging that is exactly the model's signalling NaN made
    quiet equals it (the torch gather's documented tolerance; the answers carry the KV dtype)."""

    def difference(self, model: Any, upstream: Any) -> Any:
        if isinstance(model, dict) and isinstance(upstream, dict) and "staging" in model and "staging" in upstream:
            upstream = {**upstream, "staging": unquieted(model["staging"], upstream["staging"], model["dtype"])}
        return super().difference(model, upstream)


def arrays(ctx: Context, case: Any, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(pool, staging) of the case, made once for both sides: the writer's source pool (gather) or the decode
    rank's pool (scatter), and the staging buffer with its garbage."""
    if ctx.state.get("case") is not case:
        from kvsim.models.pd_staging.layout import HeadReshard

        cfg = HeadReshard(*case.reshard)
        pool = case.pool(cfg.src_per, 1) if kind == "gather" else case.pool(cfg.dst_per, 2)
        ctx.state["case"], ctx.state["arrays"] = case, (pool, case.staging())
    return ctx.state["arrays"]


def writer_offset(case: Any, pool: np.ndarray) -> int:
    """Where the writer's bytes start: the case's offset or the layout's, rounded down to a whole element
    (upstream views the buffer as elements; its allocator never makes a byte-odd offset)."""
    offset = case.layout.writer_offsets[case.params.writer_index] if case.offset is None else case.offset
    return offset - offset % pool.itemsize


def gather_model(ctx: Context, case: Any) -> dict[str, Any]:
    from kvsim.models.pd_staging.copy import gather_head_slice_to_staging

    pool, staging = arrays(ctx, case, "gather")
    want = gather_head_slice_to_staging(pool, case.pages, case.params, case.layout, staging.copy(),
                                        writer_offset(case, pool))
    return {"staging": want, "written": case.layout.writer_size(case.params.writer_index), "dtype": case.dtype}


def gather_upstream(path: str) -> Callable[[Context, Any], dict[str, Any]]:
    def upstream(ctx: Context, case: Any) -> dict[str, Any]:
        from kvsim.gpu_oracle.runtime.asan import pack

        pool, staging = arrays(ctx, case, "gather")
        params = case.params
        result = call_kernel(ctx, GATHER_RUNNER, {
            "path": path, "pool": pack(pool), "staging": pack(staging), "offset": writer_offset(case, pool),
            "pages": list(case.pages), "head_start": params.src_head_start, "num_heads": params.num_heads})
        return {"staging": unpacked(result, "staging"), "written": result["written"], "dtype": case.dtype}
    return upstream


def scatter_model(ctx: Context, case: Any) -> dict[str, Any]:
    from kvsim.models.pd_staging.copy import scatter_staging_to_pages
    from kvsim.models.pd_staging.layout import HeadReshard, writers_of_decode_rank

    pool, staging = arrays(ctx, case, "scatter")
    want = pool.copy()
    for _, params in writers_of_decode_rank(HeadReshard(*case.reshard), case.decode_rank):
        scatter_staging_to_pages(want, staging, case.pages, params, case.layout)
    return {"pool": want.reshape(-1).view(np.uint8)}


def scatter_upstream(path: str) -> Callable[[Context, Any], dict[str, Any]]:
    def upstream(ctx: Context, case: Any) -> dict[str, Any]:
        from kvsim.gpu_oracle.runtime.asan import pack

        pool, staging = arrays(ctx, case, "scatter")
        result = call_kernel(ctx, SCATTER_RUNNER, {
            "path": path, "pool": pack(pool), "staging": pack(staging), "pages": list(case.pages),
            "reshard": list(case.reshard), "rank": case.decode_rank})
        return {"pool": np.ascontiguousarray(unpacked(result, "pool")).reshape(-1).view(np.uint8)}
    return upstream


def cases(kind: str, path: str) -> Callable[[Context], Any]:
    def strategy(ctx: Context) -> Any:
        from hypothesis import strategies as st

        from kvsim.gpu_oracle.kernels.staging import strategies

        base = strategies.GATHER_CASES if kind == "gather" else strategies.SCATTER_CASES
        if path == "torch":
            return base
        return base.flatmap(lambda c: st.sampled_from(TRITON_DTYPES).map(lambda d: replace(c, dtype=d))
                            if c.dtype not in TRITON_DTYPES else st.just(c))
    return strategy


def eight_byte_probe(ctx: Context) -> str | None:
    """Upstream's Triton gather of a float64 pool still differs from the model (the refusal still stands)."""
    from kvsim.gpu_oracle.kernels.staging.cases import CopyCase

    case = CopyCase((4, 2, 2), 0, 0, 1, 2, "float64", 2, 3, (2, 0), 0, None, 128, 11)
    got = capture(gather_upstream("triton"), ctx, case)
    if isinstance(got, FAILED):
        return f"upstream's Triton gather of a float64 pool did not answer: {got}"
    if QuietedNaN().difference(gather_model(ctx, case), got) is None:
        return "upstream's Triton gather now copies float64 pools exactly: lift the 8-byte refusal"
    return None


def pinned_cases(ctx: Context) -> list[Any]:
    """Run first on every staging target: each page size 1-4 with three distinct pages, two layers, and a writer
    whose head count (2) is not its head size (3), so a page-size-1 shortcut taken at another size, or the gather
    index expanded with the two swapped, cannot pass; and two prefill ranks writing one decode rank (decode TP 1: the
    scatter's writer count `P_tp // max(1, D_tp)` with its 1 changed); and a layer of 4,096 elements (16 tokens of 8
    heads of 32), past the Triton kernels' BLOCK_SIZE of 1,024, so a second program along the grid's block axis
    runs. A mutation run found each unreached by 40 drawn cases."""
    from kvsim.gpu_oracle.kernels.staging.cases import CopyCase

    return [CopyCase((8, 2, 4), 1, 0, 2, 3, "float16", ps, 4, (2, 0, 3), 1, None, 128, 11 + ps) for ps in (1, 2, 3, 4)] \
        + [CopyCase((4, 2, 1), 0, 1, 2, 3, "float16", 2, 4, (3, 1), 1, None, 128, 21),
           CopyCase((8, 1, 1), 0, 0, 1, 32, "float16", 4, 5, (2, 0, 3, 1), 1, None, 128, 31)]


def _adapter(kind: str, path: str) -> Differential:
    probes = (Probe("triton_staging_8_byte_elements",
                    "documented convention: the Triton staging paths view 8-byte elements as int16 and mis-copy "
                    "them; the Triton targets draw 1/2/4-byte dtypes only", eight_byte_probe),) \
        if (kind, path) == ("gather", "triton") else ()
    model, upstream = (gather_model, gather_upstream(path)) if kind == "gather" else \
        (scatter_model, scatter_upstream(path))
    return Differential(kernel=True, examples=kernel_examples, inputs=cases(kind, path),
                        model=model, upstream=upstream, compare=QuietedNaN() if kind == "gather" else EXACT,
                        describe=lambda ctx, case: case, probes=probes, pinned=pinned_cases)


GATHER_TRITON, GATHER_TORCH = _adapter("gather", "triton"), _adapter("gather", "torch")
SCATTER_TRITON, SCATTER_TORCH = _adapter("scatter", "triton"), _adapter("scatter", "torch")
