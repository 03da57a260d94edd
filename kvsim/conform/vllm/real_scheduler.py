"""vLLM's real `Scheduler` (async scheduling, a producing KV connector), imported from a release
(`kvsim.conform.installed`), driven in the child: the P/D life cycle `kv-cache-manager-pd` models
(`models/kv_cache_manager/scheduler.py`, vLLM #50297), and the local computed tokens `schedule` hands the connector
for a hybrid model (vLLM #48195, `connector_hit.through_scheduler`).

What the scheduler needs besides the manager is built as upstream's CPU tests build it
(`tests/v1/kv_connector/unit/utils.py`: `create_vllm_config`, `create_scheduler`, `MockKVConnector`), with two
differences, to stay offline and inside the release's import chain:

* the model: `ModelConfig` reads a model folder's `config.json` and inspects its architecture. Upstream's tests name
  a Hub model (facebook/opt-125m) whose inspection imports the model's module in a subprocess (its layers pull
  einops and more, outside the manager's dependency table). The driver writes a throwaway folder with an OPT
  `config.json` whose architecture is `KvsimToyForCausalLM`, registered in-process (`ModelRegistry.register_model`)
  as a `torch.nn.Module` with the methods the registry's interface checks read; nothing ever runs it.
* the connector: `KvsimProducerConnector`, a `KVConnectorBase_V1` made in the child (vLLM is not importable in the
  parent) with role `kv_producer`, so its `requires_kv_delivery` is the base class's where a release has it
  (0.27.0 on). Its `request_finished(request, block_ids)` records the block ids and, for a `do_remote_decode`
  request, keeps the blocks (`delay_free_blocks`) until a later step's `finished_sending` names the request, as
  NIXL's producer does; it loads nothing (`get_num_new_matched_tokens` is 0) and records what that call got: the
  local computed tokens the scheduler hands it, and, read from the scheduler's own block pool at the call, the block
  each group caches under each of the request's block hashes. Over several groups it is `KvsimHybridConnector`,
  the same with the release's `SupportsHMA` (the connector factory refuses one without it when the hybrid
  allocator is on); `request_finished_all_groups` answers as `request_finished` on group 0's blocks. Both say
  `supports_divergent_local_hybrid_hits` as NIXL's connector does (for any model), so the releases that read it
  (0.30.0 on) take the connector path the #48195 fix changed (`KVCacheManager.get_computed_blocks_for_connector`),
  not `get_computed_blocks`, over one group too.
* the hybrid model: the toy model stays one; the groups are the `KVCacheConfig`'s (`real_manager.kv_cache_config`,
  the one the manager and coordinator drivers build), and `CacheConfig.mamba_cache_mode` is set as the engine sets
  it for a hybrid model with prefix caching (the release's mode: `all` through 0.31.0, `align` in 0.33.0).
* with a multi-module MTP drafter (`build(mtp_lookahead=k)`, vLLM #55055): the model folder is a DeepSeek-V3
  `config.json` (`num_nextn_predict_layers` k, its architecture the toy) and the config carries the release's own
  `SpeculativeConfig(method="mtp", num_speculative_tokens=k)`, whose drafter (`hf_config_override`: model type
  deepseek_mtp, architecture `DeepSeekMTPModel`) is the toy registered under that name, so the registry never
  inspects the real drafter's module. The connector is then `KvsimNixlConnector`, the release's own
  `NixlConnector` (its scheduler side: `on_new_request`'s prefill truncation, `request_finished`), recording what
  `request_finished` got; NIXL's worker side is never built.

Ops, each answer JSON:

* `build(num_blocks, block_size, max_model_len=64, max_num_batched_tokens=64, groups=["full"], sliding_window=4,
  mtp_lookahead=0)`: a new `AsyncScheduler` over the named groups (`full`, `swa`, `mamba`; `KVCacheConfig` with
  `kv_cache_tensors=[]`), with the MTP drafter and NIXL's connector when `mtp_lookahead` > 0 (one full-attention
  group); the previous one is forgotten. Answers `observe` plus the coordinator's class name, the Mamba caching
  mode (null without a Mamba group) and `"lookahead"`: the release's `VllmConfig.num_prefill_lookahead_tokens`
  (None where it has none).
* `add(request, tokens, max_tokens, producer=False, prompt_logprobs=None)`: `add_request` (a producer request is
  `do_remote_decode`; `prompt_logprobs` N: the request asks for them, so it skips reading the prefix cache).
* `schedule()`: `schedule()`; the step's output is in flight until `output`. Answers
  `{"scheduled": {request: tokens}, "preempted": [requests]}`.
* `output(deliver=[])`: the oldest in-flight step's output returns (`update_from_output`): one sampled token per
  request the step completed the prompt of when it was scheduled (none for a chunk of one), and `finished_sending`
  for the requests named in `deliver`. Answers `observe`.
* `observe()`: `{"handed": [[request, [block ids]], ...] (every request_finished, in call order), "held":
  {request: [block ids]}, "status": {request: status name}, "free": free blocks, "matched": [...]}`;
  `held_at_hand` in `handed`'s place of each call: the blocks the manager held for the request right after the
  step that handed them; `computed` in its place: the request's `num_computed_tokens` when `request_finished` got
  it; `matched`: every `get_num_new_matched_tokens`, in call order, as `{"request",
  "local_tokens", "groups": [{"keys": [the request's block hashes keyed for the group], "cached": [the hash of the
  block the pool caches under each, or null]}]}` (hashes as hex).
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import tempfile
from typing import Any, Mapping

from kvsim.engine.errors import ConfigError

CONNECTOR = "KvsimProducerConnector"
HYBRID_CONNECTOR = "KvsimHybridConnector"
NIXL_CONNECTOR = "KvsimNixlConnector"
ARCHITECTURE = "KvsimToyForCausalLM"
MTP_ARCHITECTURE = "DeepSeekMTPModel"  # the drafter hf_config_override names for a deepseek_v3 target
OUTPUT_TOKEN = 9
EOS_TOKEN = 2
# the folder ModelConfig reads: an OPT config small enough for nothing; the architecture is the registered toy
_TOY_CONFIG = {"architectures": [ARCHITECTURE], "model_type": "opt", "hidden_size": 64, "num_attention_heads": 4,
               "num_hidden_layers": 2, "ffn_dim": 128, "vocab_size": 64, "max_position_embeddings": 256,
               "word_embed_proj_dim": 64, "do_layer_norm_before": True, "pad_token_id": 1, "bos_token_id": 2,
               "eos_token_id": EOS_TOKEN, "torch_dtype": "float16"}
# the target of the MTP build: a DeepSeek-V3 config (its drafter is DeepSeekMTPModel), sizes for nothing
_MTP_TOY_CONFIG = {"architectures": [ARCHITECTURE], "model_type": "deepseek_v3", "hidden_size": 64,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
                   "moe_intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 256, "kv_lora_rank": 16,
                   "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
                   "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                   "first_k_dense_replace": 2, "bos_token_id": 0, "eos_token_id": EOS_TOKEN, "torch_dtype": "float16"}
# what request_finished got: (request, block ids, producer, the request's num_computed_tokens then)
_RECORD: list[tuple[str, list[int], bool, int]] = []


def _record(request: Any, block_ids: list[int]) -> bool:
    producer = bool((request.kv_transfer_params or {}).get("do_remote_decode"))
    _RECORD.append((request.request_id, list(block_ids), producer, request.num_computed_tokens))
    return producer
# what get_num_new_matched_tokens got, in call order: the request, the local computed tokens the scheduler handed,
# and per group the request's block hashes keyed for the group beside the hash of the block the pool caches
# under that key then (None: none), as hex; read from the scheduler's own block pool at the call
_MATCHED: list[dict[str, Any]] = []
_POOL: list[Any] = []  # the running scheduler's block pool, and its number of groups


def _matched(request: Any, num_computed_tokens: int) -> None:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    def hexed(h: Any) -> str | None:
        return None if h is None else bytes(h).hex()

    pool, num_groups = _POOL
    groups = []
    for g in range(num_groups):
        keys = [make_block_hash_with_group_id(h, g) for h in request.block_hashes]
        cached = [(pool.get_cached_block(h, [g]) or [None])[0] for h in request.block_hashes]
        groups.append({"keys": [hexed(k) for k in keys],
                       "cached": [None if b is None else hexed(b.block_hash) for b in cached]})
    _MATCHED.append({"request": request.request_id, "local_tokens": num_computed_tokens, "groups": groups})


def _make_connector() -> type:
    """The producing connector, a subclass of the release's `KVConnectorBase_V1` (made in the child)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

    class KvsimProducerConnector(KVConnectorBase_V1):  # type: ignore[misc, valid-type]
        @property
        def supports_divergent_local_hybrid_hits(self) -> bool:
            # as NIXL's connector (whatever the groups): from 0.30.0 the scheduler asks the manager's
            # get_computed_blocks_for_connector (the #48195 fix) only for a connector that says so; before, the
            # property is not read
            return True

        def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
            _matched(request, num_computed_tokens)
            return 0, False

        def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
            return None

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            return KVConnectorMetadata()

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            return None

        def wait_for_layer_load(self, layer_name: str) -> None:
            return None

        def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
            return None

        def wait_for_save(self) -> None:
            return None

        def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
            return _record(request, block_ids), None  # a producer's blocks wait for the decode side's read

    return KvsimProducerConnector


def _make_hybrid_connector(producer: type) -> type:
    """The producing connector for a hybrid model: with the release's `SupportsHMA` (the scheduler refuses a
    connector without it over several groups), `request_finished_all_groups` answering as `request_finished`
    does on group 0's blocks."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

    class KvsimHybridConnector(producer, SupportsHMA):  # type: ignore[misc, valid-type]
        def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
            return self.request_finished(request, block_ids[0])

    return KvsimHybridConnector


def _make_nixl_connector() -> type:
    """The release's `NixlConnector` (a hybrid-aware connector: the scheduler hands it every group's blocks),
    recording what its `request_finished` got (group 0's blocks: one group here) before it acts as released."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    class KvsimNixlConnector(NixlConnector):  # type: ignore[misc, valid-type]
        def request_finished(self, request: Any, block_ids: list[int]) -> Any:
            _record(request, block_ids)
            return super().request_finished(request, block_ids)

        def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> Any:
            _record(request, block_ids[0])
            return super().request_finished_all_groups(request, block_ids)

    return KvsimNixlConnector


def _make_toy_model() -> type:
    import torch

    class KvsimToyForCausalLM(torch.nn.Module):
        """What the model registry's interface checks read; never built, never run."""

        def __init__(self, vllm_config: Any, prefix: str = "") -> None:
            super().__init__()

        def embed_input_ids(self, input_ids: Any) -> Any:
            return input_ids

        def forward(self, input_ids: Any, positions: Any) -> Any:
            return input_ids

        def compute_logits(self, hidden_states: Any) -> Any:
            return hidden_states

    return KvsimToyForCausalLM


class SchedulerDriver:
    """One real `AsyncScheduler` at a time with its producing connector, answering the ops above."""

    def __init__(self) -> None:
        from vllm import ModelRegistry
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils

        globals()[CONNECTOR] = _make_connector()  # the factory loads it by module path and class name
        globals()[HYBRID_CONNECTOR] = _make_hybrid_connector(globals()[CONNECTOR])
        ModelRegistry.register_model(ARCHITECTURE, _make_toy_model())
        ModelRegistry.register_model(MTP_ARCHITECTURE, _make_toy_model())
        kv_cache_utils.init_none_hash(sha256)
        self._sha256 = sha256
        self._model_dir = tempfile.mkdtemp(prefix="kvsim-toy-model-")
        with open(os.path.join(self._model_dir, "config.json"), "w") as fh:
            json.dump(_TOY_CONFIG, fh)
        self._mtp_dirs: dict[int, str] = {}
        self.scheduler: Any = None
        self.requests: dict[str, Any] = {}
        self.in_flight: collections.deque[Any] = collections.deque()
        self.held_at_hand: list[list[int]] = []

    def handle(self, op: str, args: Mapping[str, Any]) -> Any:
        method = getattr(self, "op_" + op, None)
        if method is None:
            raise ConfigError("op", "one of build, add, schedule, output, observe", op)
        if op != "build" and self.scheduler is None:
            raise ConfigError(op, "a scheduler built first (op build)", "none")
        try:
            inspect.signature(method).bind(**args)
        except TypeError as exc:
            raise ConfigError(op, "the arguments the op takes", sorted(args), hint=str(exc)) from None
        return method(**args)

    def _mtp_dir(self, lookahead: int) -> str:
        """The DeepSeek-V3 toy's folder with `lookahead` MTP modules (`num_nextn_predict_layers`), made once."""
        if lookahead not in self._mtp_dirs:
            folder = self._mtp_dirs[lookahead] = tempfile.mkdtemp(prefix=f"kvsim-toy-mtp{lookahead}-")
            with open(os.path.join(folder, "config.json"), "w") as fh:
                json.dump(dict(_MTP_TOY_CONFIG, num_nextn_predict_layers=lookahead), fh)
        return self._mtp_dirs[lookahead]

    def op_build(self, num_blocks: int, block_size: int, max_model_len: int = 64, max_num_batched_tokens: int = 64,
                 groups: tuple[str, ...] = ("full",), sliding_window: int = 4, mtp_lookahead: int = 0) -> Any:
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                                 SchedulerConfig, SpeculativeConfig, VllmConfig)
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.structured_output import StructuredOutputManager

        from .real_manager import kv_cache_config, mamba_cache_mode

        hybrid = len(groups) > 1
        if not isinstance(mtp_lookahead, int) or mtp_lookahead < 0 or (mtp_lookahead and hybrid):
            raise ConfigError("mtp_lookahead", "0 (no drafter) or the MTP modules' count, over one group",
                              mtp_lookahead)
        folder = self._mtp_dir(mtp_lookahead) if mtp_lookahead else self._model_dir
        model = ModelConfig(model=folder, skip_tokenizer_init=True, dtype="float16", seed=0,
                            max_model_len=max_model_len)
        spec, connector = None, HYBRID_CONNECTOR if hybrid else CONNECTOR
        if mtp_lookahead:
            if NIXL_CONNECTOR not in globals():  # NIXL's modules load on the first MTP build
                globals()[NIXL_CONNECTOR] = _make_nixl_connector()
            spec = SpeculativeConfig(method="mtp", num_speculative_tokens=mtp_lookahead, target_model_config=model,
                                     target_parallel_config=ParallelConfig())
            connector = NIXL_CONNECTOR
        sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, enable_chunked_prefill=True, is_encoder_decoder=False,
                                async_scheduling=True)
        transfer = KVTransferConfig(kv_connector=connector, kv_connector_module_path=__name__, kv_role="kv_producer")
        config = VllmConfig(scheduler_config=sched, model_config=model,
                            cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
                            kv_transfer_config=transfer, device_config=DeviceConfig("cpu"), speculative_config=spec)
        config.cache_config.num_gpu_blocks = num_blocks
        if "mamba" in groups:  # what the engine sets for a hybrid model's prefix caching (the toy model is none)
            config.cache_config.mamba_cache_mode = mamba_cache_mode()
        kv = kv_cache_config(num_blocks, block_size, groups, sliding_window)
        self.scheduler = AsyncScheduler(vllm_config=config, kv_cache_config=kv, log_stats=False,
                                        structured_output_manager=StructuredOutputManager(config),
                                        block_size=block_size)
        self.block_size = block_size
        self.requests.clear()
        self.in_flight.clear()
        self.held_at_hand.clear()
        _RECORD.clear()
        _MATCHED.clear()
        _POOL[:] = [self.scheduler.kv_cache_manager.block_pool, len(groups)]
        return {**self.op_observe(), "coordinator": type(self.scheduler.kv_cache_manager.coordinator).__name__,
                "mamba_cache_mode": config.cache_config.mamba_cache_mode if "mamba" in groups else None,
                "lookahead": getattr(config, "num_prefill_lookahead_tokens", None)}

    def op_add(self, request: str, tokens: list[int], max_tokens: int, producer: bool = False,
               prompt_logprobs: int | None = None) -> Any:
        from vllm import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, prompt_logprobs=prompt_logprobs)
        params.update_from_generation_config({}, EOS_TOKEN)
        req = Request(request_id=request, prompt_token_ids=list(tokens), sampling_params=params, pooling_params=None,
                      block_hasher=get_request_block_hasher(self.block_size, self._sha256))
        req.kv_transfer_params = {"do_remote_prefill": False, "do_remote_decode": True} if producer else None
        self.requests[request] = req
        self.scheduler.add_request(req)
        return None

    def op_schedule(self) -> Any:
        out = self.scheduler.schedule()
        # a step samples for the requests whose prompt it completes, as the model runner does (none for a chunk);
        # decided when it is scheduled: a request preempted while the step is in flight still gets its token
        sampled = {r: self.requests[r].num_computed_tokens >= self.requests[r].num_prompt_tokens
                   for r in out.num_scheduled_tokens}
        self.in_flight.append((out, sampled))
        return {"scheduled": dict(out.num_scheduled_tokens), "preempted": sorted(getattr(out, "preempted_req_ids", ())
                                                                                or ())}

    def op_output(self, deliver: list[str] = ()) -> Any:  # type: ignore[assignment]
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        if not self.in_flight:
            raise ConfigError("output", "a step in flight (op schedule first)", "none")
        out, sampled = self.in_flight.popleft()
        ids = list(out.num_scheduled_tokens)
        sending = KVConnectorOutput(finished_sending=set(deliver)) if deliver else None
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=[[OUTPUT_TOKEN] if sampled[r] else [] for r in ids],
                                   logprobs=None,
                                   prompt_logprobs_dict={}, pooler_output=None, kv_connector_output=sending)
        before = len(_RECORD)
        self.scheduler.update_from_output(out, runner)
        for request, *_ in _RECORD[before:]:
            self.held_at_hand.append(self._held(request))
        return self.op_observe()

    def _held(self, request: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(request)[0])

    def op_observe(self) -> Any:
        return {"handed": [[r, blocks, producer] for r, blocks, producer, _ in _RECORD],
                "computed": [computed for *_, computed in _RECORD],
                "held_at_hand": list(self.held_at_hand),
                "held": {r: self._held(r) for r in self.requests},
                "status": {r: req.status.name for r, req in self.requests.items()},
                "free": self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                "matched": list(_MATCHED)}


# --- parent side: the race of #50297 on a running child ------------------------------------------------------

def race(child: Any, num_blocks: int = 3, block_size: int = 2, prompt_len: int = 2, max_tokens: int = 2,
         max_steps: int = 16) -> dict[str, Any]:
    """`kv-cache-manager-pd`'s default configuration on the real scheduler (`child` runs `SchedulerDriver`): a local
    request L (`max_tokens` outputs) and a producer P, one prompt block each, two usable blocks. Both prefill in
    step 1; step 2 is scheduled before step 1's output returns (async scheduling) and L's decode needs a second
    block, so the scheduler preempts P (the last running request) while P's final step is in flight. Then outputs
    return and steps are scheduled in turn, a producer delivered (`finished_sending`) in the output after the one
    that handed its blocks, until every request is finished.

    Answers `{"preempted": step 2's preempted requests, "handed": [[request, blocks, held then]] for the producer
    requests, "problems": [model check messages], "status", "free", "steps", "scheduled": the tokens each step
    that scheduled P computed for it}` (`free`: the pool's free blocks at
    the end, all but the null block when nothing leaked); `problems` is empty exactly when the model's
    `finished_into_producer_owns_blocks` (`owns_blocks`) holds at every hand-off."""
    from kvsim.models.kv_cache_manager.scheduler import owns_blocks

    child.call("build", num_blocks=num_blocks, block_size=block_size)
    child.call("add", request="L", tokens=[2] * prompt_len, max_tokens=max_tokens, producer=False)
    child.call("add", request="P", tokens=[1] * prompt_len, max_tokens=1, producer=True)
    scheduled = []  # the tokens each step scheduled for P (steps without P left out)

    def schedule() -> dict[str, Any]:
        answer = child.call("schedule")
        if "P" in answer["scheduled"]:
            scheduled.append(answer["scheduled"]["P"])
        return answer

    schedule()
    preempted = schedule()["preempted"]
    in_flight, pending, delivered, steps = 2, [], set(), 2
    state = child.call("observe")
    while in_flight:
        state = child.call("output", deliver=pending)
        delivered.update(pending)
        in_flight -= 1
        pending = [r for r, _, producer in state["handed"] if producer and r not in delivered]
        finished = all(status.startswith("FINISHED") for status in state["status"].values())
        if (pending or not finished) and steps < max_steps:  # a delivery rides on a later step's output
            schedule()
            in_flight, steps = in_flight + 1, steps + 1
    handed = [[r, blocks, held] for (r, blocks, producer), held in zip(state["handed"], state["held_at_hand"])
              if producer]
    problems = [f"request {r} {problem}" for r, blocks, held in handed
                if (problem := owns_blocks(blocks, held, prompt_len, block_size)) is not None]
    return {"preempted": preempted, "handed": handed, "problems": problems, "status": state["status"],
            "free": state["free"], "steps": steps, "scheduled": scheduled}
