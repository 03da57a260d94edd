"""The engine code `kv-cache-manager` is checked against (`kvsim conform vllm`): declarations only.

`KVCacheManager` (target `kv_cache_manager_lockstep`): vLLM's real manager, imported from the release in a child
process (`kvsim.conform.installed`), in lockstep with the model (`kvsim.conform.vllm.manager_lockstep`). The
declared files are not loaded in kvsim's process (no names); `checked` names the definitions of one full-attention
group's request life cycle, whose lines `--coverage` counts (traced in the child) and whose mutants `--mutants`
loads into the child.
"""

from kvsim.engine.conformance.declare import ConformTarget, Survivor, Unreached, Upstream

CORE = "vllm/v1/core/"
BLOCK_POOL, MANAGER, SINGLE_TYPE = CORE + "block_pool.py", CORE + "kv_cache_manager.py", \
    CORE + "single_type_kv_cache_manager.py"

# What the model's slice has no counterpart of: one full-attention group, its hash block size the block size, no
# metrics collector, no other group's pool, no sparse (sliding-window / Mamba) mask, no multimodal or LoRA extra keys,
# no lookahead hashing, no connector (external tokens, delayed caching), no DCP or EAGLE, no cross-attention group (so
# no encoder tokens: upstream's coordinator hands them to a cross-attention group alone). Lookahead slots
# (`num_lookahead_tokens`) are drawn.
ONE_GROUP = "one full-attention group (the model's slice): "
METRICS = "the KV cache metrics collector: the lockstep's manager is built without one (log_stats off)"
WATCHERS = "reuse watchers (the connector's offload of blocks about to be reused): no connector in the lockstep"
MAP_TYPE = "a cached-map value that is neither a block nor a dict of blocks: the map stores only those"
ONE_HASH = ("a block's hash is in the cached map, under its own id, exactly while the block holds it (the model's "
            "cached_map_hashes invariant), so an eviction always finds its block there")
UNREACHED = (
    *(Unreached(f"BlockHashToBlockMap.{method}", "self._unexpected_blocks_type(blocks)", MAP_TYPE)
      for method in ("get_one_block", "insert", "pop")),
    Unreached("BlockHashToBlockMap.pop", "if blocks is None:", ONE_HASH),
    Unreached("BlockHashToBlockMap.pop", "if blocks.block_id == block_id:", ONE_HASH),
    Unreached("BlockPool.cache_full_blocks", "if num_cached_blocks >= num_full_blocks:",
              "the manager calls it only with new full blocks (its own test before the call)"),
    Unreached("BlockPool.cache_full_blocks", "if blk.is_null or (block_mask is not None",
              ONE_GROUP + "no null block inside a full-attention table, no sparse mask"),
    Unreached("BlockPool.cache_full_blocks", "if blk.block_hash is not None:",
              "partial -> full promotion of a block hashed at a finer hash block size: the lockstep hashes at the "
              "block size"),
    Unreached("BlockPool.cache_full_blocks", "if blocks[i].is_null:", ONE_GROUP + "no null block in the table"),
    Unreached("BlockPool.cache_full_blocks", "if block_mask is not None and not block_mask",
              ONE_GROUP + "no sparse mask"),
    Unreached("BlockPool.cache_full_blocks", "if lookahead_token_ids is not None:",
              "lookahead hashing (num_hash_lookahead_tokens): off in the lockstep"),
    Unreached("BlockPool.get_new_blocks", "raise ValueError(", "the manager checks the free count before it asks"),
    Unreached("BlockPool.get_new_blocks", "if self._reuse_watchers:", WATCHERS),
    Unreached("BlockPool.reset_prefix_cache", "if self._reuse_watchers:", WATCHERS),
    *(Unreached(f"BlockPool.{method}", "if self.metrics_collector:", METRICS)
      for method in ("get_new_blocks", "_maybe_evict_cached_block", "touch", "reset_prefix_cache")),
    Unreached("BlockPool.touch", "if block.is_null:", ONE_GROUP + "a full-attention hit holds no null block"),
    Unreached("BlockPool.free_blocks", "if block.is_null:", ONE_GROUP + "a full-attention table holds no null block"),
    Unreached("BlockPool.free_blocks", "if block.pool is not None and block.pool is not self:",
              ONE_GROUP + "every block is the one pool's"),
    Unreached("BlockPool.free_blocks", "pool.free_blocks(blocks)", ONE_GROUP + "every block is the one pool's"),
    Unreached("BlockPool.take_events", "if not self.enable_kv_cache_events:", "the lockstep compares the events: on"),
    Unreached("KVCacheManager.get_computed_blocks", "if not self.prefix_cache_lookup_enabled(request):",
              "caching on, and no request skips the cache (prompt logprobs, pooling)"),
    Unreached("KVCacheManager.get_computed_blocks", "self.coordinator.emit_cached_block_events(",
              "kv_cache_report_mode 'full' (a gateway's setting): the requests report incrementally"),
    Unreached("KVCacheManager.allocate_slots", "raise ValueError(",
              "a call with nothing to allocate or adopt: a hit always leaves the last token to compute"),
    Unreached("KVCacheManager.allocate_slots", "if self.retained_hit_group_ids:",
              ONE_GROUP + "no group retains a longer hit"),
    Unreached("KVCacheManager.allocate_slots", "if full_sequence_must_fit:",
              "the scheduler's admission gate for chunked prefill: the lockstep schedules whole prompts"),
    Unreached("KVCacheManager.allocate_slots", "if delay_cache_blocks:",
              "P/D's delayed caching (a connector's remote load): no connector in the lockstep"),
    Unreached("KVCacheManager.reset_prefix_cache", "if self.log_stats:", METRICS),
    Unreached("KVCacheManager.take_events", "if event.group_idx is None:", ONE_GROUP + "events carry group 0"),
    Unreached("KVCacheManager.take_events", "if event.group_idx < 0 or event.group_idx >= len(",
              ONE_GROUP + "events carry group 0"),
    Unreached("SingleTypeKVCacheManager.get_num_blocks_to_allocate", "num_required_blocks = min(",
              "the in-flight admission cap (max_in_flight_tokens below max_model_len): unset in the lockstep"),
    Unreached("SingleTypeKVCacheManager.get_num_blocks_to_allocate", "if self._has_partial_local_hit(",
              "a partial (sub-block) hit: the lockstep hashes at the block size"),
    Unreached("SingleTypeKVCacheManager.allocate_new_blocks", "if request_id in self._partial_hit_reqs:",
              "a partial (sub-block) hit's copy-on-write: the lockstep hashes at the block size"),
    Unreached("SingleTypeKVCacheManager.allocate_new_blocks", "if self._record_new_block_ids:",
              "new block ids recorded for zeroing (a Mamba / hybrid model's): off for full attention"),
    Unreached("SingleTypeKVCacheManager.cache_blocks", "if not self.kv_cache_spec.prefix_cacheable:",
              ONE_GROUP + "full attention is prefix-cacheable"),
    Unreached("SingleTypeKVCacheManager.cache_blocks", "if request.shared_prefix_boundary:",
              "a shared-prefix junction of a sparse-retention group (Mamba / sliding window): none here"),
    Unreached("FullAttentionManager.find_longest_cache_hit", "if dcp_world_size > 1:",
              "decode context parallelism: one rank"),
    Unreached("FullAttentionManager.find_longest_cache_hit", "if fine_grained:",
              "fine-grained (sub-block) hits: the lockstep hashes at the block size"),
    Unreached("FullAttentionManager.find_longest_cache_hit", "if drop_eagle_block and hit_length > 0:",
              "EAGLE's dropped block: no speculative decoding in the lockstep"),
)

# Mutants the lockstep cannot kill because they change nothing in its slice (equivalent there), each with the reason;
# matched by definition, operator, text, replacement and a piece of the mutant's source line (0.33.0's).
SYMMETRIC = "min's or max's two arguments swapped"
SAME_SIZE = "the hash block size and the block size swapped: equal in the lockstep (it hashes at the block size)"
ASSERT_MASK = "the block-mask assertion: there is no mask (`block_mask is None` decides it)"
HASH_TOKENS = ("the token count a block's hash covers (block_hash_num_tokens): read only by a partial -> full "
               "promotion, at a finer hash block size")
NO_EXTRA_KEYS = "the multimodal / LoRA extra keys of a block: the lockstep's requests have none (every key is None)"
ASSERTED_ZERO = "`ref_cnt += 1` made `= 1` on a block the line before asserts has ref_cnt 0"
CACHING_ON = "prefix caching off (`enable_caching`): the lockstep's manager caches"
REPORT_FULL = "kv_cache_report_mode 'full' (a gateway's setting): the requests report incrementally"
BOUNDARY = ("the shared-prefix boundary (get_computed_blocks' third count) is for sparse-retention groups and is "
            "not read with one full-attention group (0.26.0 returns no such count)")
NEW_TOKENS = "the guard against a call with no tokens: every call of the lockstep has at least one new token"
WATERMARK = "the admission watermark: 0 in the lockstep (no watermark blocks either way)"
PREFILL_END = "prefill_end: read by sliding-window and Mamba groups only"
SKIPPED = "blocks outside the attention window (remove_skipped_blocks): full attention skips none"
EXTERNAL = "external (connector) computed tokens: none in the lockstep"
MAIN_MODEL_COUNT = ("the main model's token count and the encoder tokens swapped: full attention allocates for the "
                    "slots alone, lookahead included (Mamba in mode align and cross-attention groups read those)")
ADMISSION = "the per-request admission cap: applied only under full_sequence_must_fit, which the lockstep leaves off"
ZERO_NEW = "`num_new_blocks <= 0` made `< 0`: get_new_blocks(0) takes no block"
CACHED_ALREADY = "`>=` made `>`: at equality cache_full_blocks returns at once (its own first test)"
HASHED_ALIGNED = ("the smaller count is the hashed tokens', a multiple of the block size: the lockstep allocates "
                  "a request's every token at once (no chunked prefill)")
FINE_GRAINED = ("the fine-grained hit test at an alignment equal to the block size: its partial probe finds no "
                "index to try, the hit is the same")
ONE_GROUP_LIST = "one more (empty) group list in the hit: only group 0's is read"
ALIGNED_HIT = "the hit length is a multiple of the block size (no fine-grained hit): floor and ceiling agree"
FA_CAPS = ("chunked local attention is drawn beside full attention (as Llama 4 interleaves them), whose hit, whole "
           "blocks up to max_length, caps the reconciled one: the coordinator looks the local group up again at that "
           "block-aligned length, where floor and ceiling agree")
CHUNK_BLOCKS = ("the chunk's first token is a multiple of the chunk size, a whole number of blocks (the lockstep's "
                "chunks are one to three blocks): floor and ceiling agree")
ZERO_START = "`max_length >= 0` differs from `> 0` only at 0, where `0 // chunk * chunk` is the else branch's 0"
UNREAD_LIST = "one more group list in the hit (null blocks before the chunk): the coordinator reads one per group"
def _equivalent(definition: str, reason: str, *mutants: tuple[str, str, str, str]) -> tuple[Survivor, ...]:
    """Survivors of one definition for one reason, each (operator, original, replacement, a piece of its line)."""
    return tuple(Survivor(definition, op, original, reason, replacement=replacement, line=line)
                 for op, original, replacement, line in mutants)


SURVIVORS = (
    *_equivalent('BlockPool.cache_full_blocks', ASSERT_MASK,
                 ('boolean', 'block_mask is None or len(block_mask) == len(new_full_blocks)', '((block_mask is None))', 'assert block_mask is None or len(block_mask) == len(new_full'),
                 ('comparison', '==', '!=', 'assert block_mask is None or len(block_mask) == len(new_full')),
    *_equivalent('BlockPool.cache_full_blocks', SAME_SIZE,
                 ('arguments', 'self.hash_block_size, block_size', 'block_size, self.hash_block_size', 'block_hashes = resolve_block_hashes(')),
    *_equivalent('BlockPool.cache_full_blocks', HASH_TOKENS,
                 ('constant', '1', '0', 'num_hash_tokens = (num_cached_blocks + i + 1) * block_size'),
                 ('constant', '1', '2', 'num_hash_tokens = (num_cached_blocks + i + 1) * block_size')),
    *_equivalent('BlockPool.cache_full_blocks', NO_EXTRA_KEYS,
                 ('constant', '0', '1', 'curr_mm_idx = 0'),
                 ('arguments', 'num_cached_blocks, num_full_blocks', 'num_full_blocks, num_cached_blocks', 'for i in range(num_cached_blocks, num_full_blocks):'),
                 ('bound', 'num_full_blocks', '(num_full_blocks) - 1', 'for i in range(num_cached_blocks, num_full_blocks):'),
                 ('arguments', 'block_start, block_end', 'block_end, block_start', 'extra_keys, curr_mm_idx = self._generate_event_extra_keys('),
                 ('arguments', 'block_end, curr_mm_idx', 'curr_mm_idx, block_end', 'extra_keys, curr_mm_idx = self._generate_event_extra_keys(')),
    *_equivalent('BlockPool.get_new_blocks', ASSERTED_ZERO,
                 ('assignment', '+=', '=', 'block.ref_cnt += 1')),
    *_equivalent('BlockPool.get_new_blocks', CACHING_ON,
                 ('comparison', '==', '!=', 'assert block.ref_cnt == 0'),
                 ('constant', '0', '1', 'assert block.ref_cnt == 0'),
                 ('assignment', '+=', '=', 'block.ref_cnt += 1'),
                 ('constant', '1', '0', 'block.ref_cnt += 1'),
                 ('constant', '1', '2', 'block.ref_cnt += 1')),
    *_equivalent('BlockPool.free_blocks', CACHING_ON,
                 ('boolean', 'block.block_hash is None or not self.enable_caching', '((block.block_hash is None))', 'if block.block_hash is None or not self.enable_caching:')),
    *_equivalent('KVCacheManager.get_computed_blocks', REPORT_FULL,
                 ('boolean', 'num_new_computed_tokens > 0\n            and self.enable_kv_cache_events\n            and getattr(request, "kv_cache_report_mode", "incremental") == "full"', '((num_new_computed_tokens > 0) and (getattr(request, "kv_cache_report_mode", "incremental") == "full")\n\n)', 'num_new_computed_tokens > 0'),
                 ('boolean', 'num_new_computed_tokens > 0\n            and self.enable_kv_cache_events\n            and getattr(request, "kv_cache_report_mode", "incremental") == "full"', '((self.enable_kv_cache_events) and (getattr(request, "kv_cache_report_mode", "incremental") == "full")\n\n)', 'num_new_computed_tokens > 0'),
                 ('comparison', '>', '>=', 'num_new_computed_tokens > 0'),
                 ('constant', '0', '1', 'num_new_computed_tokens > 0'),
                 ('arguments', '"kv_cache_report_mode", "incremental"', '"incremental", "kv_cache_report_mode"', 'and getattr(request, "kv_cache_report_mode", "incremental") ')),
    *_equivalent('KVCacheManager.get_computed_blocks', BOUNDARY,
                 ('constant', '0', '1', 'num_new_computed_tokens + num_uncached if num_uncached else ')),
    *_equivalent('KVCacheManager.allocate_slots', NEW_TOKENS,
                 ('boolean', 'num_new_tokens == 0\n            and num_external_computed_tokens == 0\n            and num_new_computed_tokens == 0', '((num_new_tokens == 0) and (num_external_computed_tokens == 0)\n\n)', 'num_new_tokens == 0'),
                 ('boolean', 'num_new_tokens == 0\n            and num_external_computed_tokens == 0\n            and num_new_computed_tokens == 0', '((num_new_tokens == 0) and (num_new_computed_tokens == 0)\n\n)', 'num_new_tokens == 0'),
                 ('comparison', '==', '!=', 'and num_external_computed_tokens == 0'),
                 ('constant', '0', '1', 'and num_external_computed_tokens == 0'),
                 ('comparison', '==', '!=', 'and num_new_computed_tokens == 0'),
                 ('constant', '0', '1', 'and num_new_computed_tokens == 0')),
    *_equivalent('KVCacheManager.allocate_slots', SYMMETRIC,
                 ('arguments', 'num_local_computed_tokens + num_external_computed_tokens,\n            self.max_model_len', 'self.max_model_len,\n            num_local_computed_tokens + num_external_computed_tokens', 'total_computed_tokens = min('),
                 ('arguments', 'num_tokens_main_model + num_lookahead_tokens, self.max_model_len', 'self.max_model_len, num_tokens_main_model + num_lookahead_tokens', 'num_tokens_need_slot = min('),
                 ('arguments', '0, total_computed_tokens - request.num_in_flight_tokens', 'total_computed_tokens - request.num_in_flight_tokens, 0', 'max(0, total_computed_tokens - request.num_in_flight_tokens)'),
                 ('arguments', 'total_computed_tokens + num_new_tokens,\n            request.num_tokens', 'request.num_tokens,\n            total_computed_tokens + num_new_tokens', 'num_tokens_to_cache = min(')),
    *_equivalent('KVCacheManager.allocate_slots', WATERMARK,
                 ('boolean', 'has_scheduled_reqs and request.status in (\n            RequestStatus.WAITING,\n            RequestStatus.PREEMPTED,\n        )', '((has_scheduled_reqs)\n\n\n)', 'if has_scheduled_reqs and request.status in ('),
                 ('boolean', 'has_scheduled_reqs and request.status in (\n            RequestStatus.WAITING,\n            RequestStatus.PREEMPTED,\n        )', '((request.status in (\n            RequestStatus.WAITING,\n            RequestStatus.PREEMPTED,\n        )))', 'if has_scheduled_reqs and request.status in ('),
                 ('comparison', 'in', 'not in', 'if has_scheduled_reqs and request.status in (')),
    *_equivalent('KVCacheManager.allocate_slots', PREFILL_END,
                 ('arguments', 'request.num_prompt_tokens, request.num_tokens - 1', 'request.num_tokens - 1, request.num_prompt_tokens', 'prefill_end = max(request.num_prompt_tokens, request.num_tok'),
                 ('constant', '1', '0', 'prefill_end = max(request.num_prompt_tokens, request.num_tok'),
                 ('constant', '1', '2', 'prefill_end = max(request.num_prompt_tokens, request.num_tok')),
    *_equivalent('KVCacheManager.allocate_slots', SKIPPED,
                 ('arguments', 'request.request_id,\n            max(0, total_computed_tokens - request.num_in_flight_tokens)', 'max(0, total_computed_tokens - request.num_in_flight_tokens),\n            request.request_id', 'self.coordinator.remove_skipped_blocks('),
                 ('constant', '0', '1', 'max(0, total_computed_tokens - request.num_in_flight_tokens)')),
    *_equivalent('KVCacheManager.allocate_slots', EXTERNAL,
                 ('boolean', 'new_computed_block_list is not self.empty_kv_cache_blocks.blocks\n            or num_external_computed_tokens > 0', '((new_computed_block_list is not self.empty_kv_cache_blocks.blocks)\n)', 'new_computed_block_list is not self.empty_kv_cache_blocks.bl'),
                 ('comparison', '>', '>=', 'or num_external_computed_tokens > 0'),
                 ('constant', '0', '1', 'or num_external_computed_tokens > 0')),
    *_equivalent('KVCacheManager.allocate_slots', MAIN_MODEL_COUNT,
                 ('arguments', 'num_tokens_main_model,\n            num_encoder_tokens', 'num_encoder_tokens,\n            num_tokens_main_model', 'new_blocks = self.coordinator.allocate_new_blocks(')),
    *_equivalent('SingleTypeKVCacheManager.get_num_blocks_to_allocate', ADMISSION,
                 ('boolean', 'apply_admission_cap and self.max_admission_blocks_per_request is not None', '((apply_admission_cap))', 'if apply_admission_cap and self.max_admission_blocks_per_req'),
                 ('boolean', 'apply_admission_cap and self.max_admission_blocks_per_request is not None', '((self.max_admission_blocks_per_request is not None))', 'if apply_admission_cap and self.max_admission_blocks_per_req'),
                 ('comparison', 'is not', 'is', 'if apply_admission_cap and self.max_admission_blocks_per_req')),
    *_equivalent('SingleTypeKVCacheManager.get_num_blocks_to_allocate', SYMMETRIC,
                 ('arguments', 'num_required_blocks - num_req_blocks, 0', '0, num_required_blocks - num_req_blocks', 'return max(num_required_blocks - num_req_blocks, 0)'),
                 ('arguments', 'num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks),\n            0', '0,\n            num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks)', 'num_new_blocks = max('),
                 ('arguments', 'num_skipped_blocks, num_local_computed_blocks', 'num_local_computed_blocks, num_skipped_blocks', 'num_required_blocks - max(num_skipped_blocks, num_local_comp'),
                 ('arguments', '0, num_skipped_blocks - num_req_blocks', 'num_skipped_blocks - num_req_blocks, 0', 'num_skipped_new_computed_blocks = max(0, num_skipped_blocks ')),
    *_equivalent('SingleTypeKVCacheManager.get_num_blocks_to_allocate', SKIPPED,
                 ('division', 'num_skipped_tokens // self.block_size', '(-(-(num_skipped_tokens )//( self.block_size)))', 'num_skipped_blocks = num_skipped_tokens // self.block_size')),
    *_equivalent('SingleTypeKVCacheManager.allocate_new_blocks', ZERO_NEW,
                 ('comparison', '<=', '<', 'if num_new_blocks <= 0:')),
    *_equivalent('SingleTypeKVCacheManager.cache_blocks', HASHED_ALIGNED,
                 ('division', 'min(num_tokens, num_hashed_tokens) // self.block_size', '(-(-(min(num_tokens, num_hashed_tokens) )//( self.block_size)))', 'num_full_blocks = min(num_tokens, num_hashed_tokens) // self')),
    *_equivalent('SingleTypeKVCacheManager.cache_blocks', SYMMETRIC,
                 ('arguments', 'num_tokens, num_hashed_tokens', 'num_hashed_tokens, num_tokens', 'num_full_blocks = min(num_tokens, num_hashed_tokens) // self')),
    *_equivalent('SingleTypeKVCacheManager.cache_blocks', CACHED_ALREADY,
                 ('comparison', '>=', '>', 'if num_cached_blocks >= num_full_blocks:')),
    *_equivalent('FullAttentionManager.find_longest_cache_hit', SAME_SIZE,
                 ('arguments', 'block_pool.hash_block_size,\n            block_size', 'block_size,\n            block_pool.hash_block_size', 'block_hashes = resolve_block_hashes(')),
    *_equivalent('FullAttentionManager.find_longest_cache_hit', FINE_GRAINED,
                 ('boolean', 'alignment_tokens < block_size and block_size % alignment_tokens == 0', '((alignment_tokens < block_size))', 'alignment_tokens < block_size and block_size % alignment_tok'),
                 ('boolean', 'alignment_tokens < block_size and block_size % alignment_tokens == 0', '((block_size % alignment_tokens == 0))', 'alignment_tokens < block_size and block_size % alignment_tok'),
                 ('comparison', '<', '<=', 'alignment_tokens < block_size and block_size % alignment_tok'),
                 ('comparison', '==', '!=', 'alignment_tokens < block_size and block_size % alignment_tok'),
                 ('constant', '0', '1', 'alignment_tokens < block_size and block_size % alignment_tok')),
    *_equivalent('FullAttentionManager.find_longest_cache_hit', ONE_GROUP_LIST,
                 ('bound', 'len(kv_cache_group_ids)', '(len(kv_cache_group_ids)) + 1', '[] for _ in range(len(kv_cache_group_ids))')),
    *_equivalent('ChunkedLocalAttentionManager.find_longest_cache_hit', SAME_SIZE,
                 ('arguments', 'block_pool.hash_block_size,\n            kv_cache_spec.block_size', 'kv_cache_spec.block_size,\n            block_pool.hash_block_size', 'block_hashes = resolve_block_hashes(')),
    *_equivalent('ChunkedLocalAttentionManager.find_longest_cache_hit', FA_CAPS,
                 ('division', 'max_length // kv_cache_spec.block_size', '(-(-(max_length )//( kv_cache_spec.block_size)))', 'max_num_blocks = max_length // kv_cache_spec.block_size')),
    *_equivalent('ChunkedLocalAttentionManager.find_longest_cache_hit', ZERO_START,
                 ('comparison', '>', '>=', 'if max_length > 0:')),
    *_equivalent('ChunkedLocalAttentionManager.find_longest_cache_hit', CHUNK_BLOCKS,
                 ('division', 'local_attention_start_idx // kv_cache_spec.block_size', '(-(-(local_attention_start_idx )//( kv_cache_spec.block_size)))', 'local_attention_start_idx // kv_cache_spec.block_size')),
    *_equivalent('ChunkedLocalAttentionManager.find_longest_cache_hit', UNREAD_LIST,
                 ('bound', 'len(kv_cache_group_ids)', '(len(kv_cache_group_ids)) + 1', 'for _ in range(len(kv_cache_group_ids))')),
    *_equivalent('FullAttentionManager.find_longest_cache_hit', ALIGNED_HIT,
                 ('division', 'cdiv(hit_length, block_size)', '((hit_length) // (block_size))', 'num_blocks = cdiv(hit_length, block_size)')),
)

# The real-scheduler Sweeps' checked definitions (the methods each seed bug's fix changed): what their inputs do not
# reach, and the mutants that change nothing they can tell apart, each with the reason.
SWEEP_UNREACHED = (
    Unreached("KVCacheManager.get_computed_blocks_for_connector",
              "if not self.prefix_cache_lookup_enabled(request):",
              "caching on, and no request skips the cache (prompt logprobs, pooling)"),
    Unreached("Scheduler._preempt_request", "if self.aux_output_connector is not None:",
              "an auxiliary output connector (the engine's output offload): none is configured"),
    Unreached("Scheduler._preempt_request", "if request.spec_token_ids:",
              "speculative decoding: the race's scheduler has no drafter, so no request holds draft tokens"),
    Unreached("Scheduler._preempt_request", "if self.log_stats:",
              "the scheduler is built with log_stats off (no per-request event timestamps)"),
    Unreached("NixlBaseConnectorScheduler._truncate_request_for_prefill",
              "elif request.prompt_embeds is not None:",
              "a prompt of embeddings: every request of the sweep is token ids"),
    Unreached("NixlBaseConnectorScheduler._truncate_request_for_prefill", "return",
              "a prompt of neither token ids nor embeddings: every request of the sweep is token ids"),
)
NO_ENCODER = ("the request has no encoder inputs, so `_pending_encoder_input_ids` holds no entry for it: "
              "`pop` with either argument order finds none and raises nothing")
DELIVERY = ("`drop_stale_output` is True on every preemption the race makes (its producer connector requires KV "
            "delivery, `Scheduler.requires_kv_delivery`), so the `or`'s right side is never read")
WHOLE_PREFILLS = ("the race schedules every prefill whole (two prompts of at most 4 tokens, the model's bound, in a "
                  "step budget of 64 tokens, which the release lets no lower than max_num_seqs, 8; no long-prefill "
                  "threshold), so the producer's recompute is one step, after "
                  "which the count is 1 either way: the async scheduler adds a step's placeholder only to a step that is "
                  "not a prefill chunk, and the mutant's 1 makes the recompute step count as one (`is_prefill_chunk`, read "
                  "otherwise only by structured output, drafts and DP prefill balancing, none of which the race has). "
                  "Only a chunked recompute reads the count differently (its next chunk one token longer)")
PREEMPTION_COUNT = ("`num_preemptions` is read only by the engine's stats (`vllm/v1/metrics`), which the scheduler "
                    "built with log_stats off never records")
ALL_EQUAL = ("`min(per_group_hits) <= num_local` differs from `<` only where every group's hit equals full "
             "attention's (none is deeper: the test before it); there `hit_diverged` makes the scheduler, its "
             "connector loading nothing, look up `get_computed_blocks` again, which finds that same hit, the same "
             "blocks and no uncached shared prefix (boundary 0), after the connector was handed the same tokens")
NO_MAMBA_ARM = ("the producer's model has neither Mamba layers nor DSV4's bounded-replay window (the MTP build is one "
                "full-attention group): the backoff is the drafter's alone, and the Mamba arm is never taken")
ONE_CALL = ("the scheduler calls the connector's `on_new_request` once per request (from `add_request`; a preempted "
            "request waits again without being added), so the guard against a second truncation is never needed, "
            "and `params` is the producer's own (`on_new_request` truncates only a `do_remote_decode` request)")
STOP_AT_ONE = ("the truncated producer's output budget made 0 instead of 1: it stops after its first sampled token "
               "either way (the stop test is `num_output_tokens >= max_tokens`, read after a token is appended)")
# `_truncate_request_for_prefill`'s test, as 0.33.0 writes it (its comments inside), and the clauses kept when one is
# dropped
TRUNCATE_TEST = ("backoff\n            and params is not None\n            # Guard against repeated truncation after "
                 "preemption/reschedule.\n            and not params.get(\"_p_side_truncated\")\n            and "
                 "request.num_prompt_tokens > backoff\n            # A request that skips reading the prefix cache "
                 "(prompt logprobs)\n            # loads nothing on the decoder, which recomputes its whole prompt."
                 "\n            and not request.get_skip_reading_prefix_cache()")
KEPT = ("(backoff)", "(params is not None)", "(not params.get(\"_p_side_truncated\"))",
        "(request.num_prompt_tokens > backoff)", "(not request.get_skip_reading_prefix_cache())")


def _dropped(clause: int) -> str:
    """The mutant's test with clause `clause` of `TRUNCATE_TEST` dropped."""
    return "(" + " and ".join(k for i, k in enumerate(KEPT) if i != clause) + "\n" * 7 + ")"


SWEEP_SURVIVORS = (
    *(Survivor("NixlBaseConnectorScheduler._truncate_request_for_prefill", "boolean", TRUNCATE_TEST, ONE_CALL,
               replacement=_dropped(clause), line="backoff") for clause in (1, 2)),
    *_equivalent("NixlBaseConnectorScheduler._prefill_backoff", NO_MAMBA_ARM,
                 ("constant", "1", "0", "1 if self._has_mamba or self._bounded_replay else 0"),
                 ("constant", "1", "2", "1 if self._has_mamba or self._bounded_replay else 0"),
                 ("boolean", "self._has_mamba or self._bounded_replay", "((self._bounded_replay))",
                  "1 if self._has_mamba or self._bounded_replay else 0"),
                 ("boolean", "self._has_mamba or self._bounded_replay", "((self._has_mamba))",
                  "1 if self._has_mamba or self._bounded_replay else 0")),
    *_equivalent("NixlBaseConnectorScheduler._prefill_backoff", SYMMETRIC,
                 ("arguments", "1 if self._has_mamba or self._bounded_replay else 0,\n            "
                  "self.vllm_config.num_prefill_lookahead_tokens - 1", "self.vllm_config.num_prefill_lookahead_tokens"
                  " - 1,\n            1 if self._has_mamba or self._bounded_replay else 0", "return max(")),
    *_equivalent("NixlBaseConnectorScheduler._truncate_request_for_prefill", STOP_AT_ONE,
                 ("constant", "1", "0", "request.max_tokens = 1")),
    *_equivalent("KVCacheManager.get_computed_blocks_for_connector", ALL_EQUAL,
                 ("comparison", "<", "<=", "return blocks, num_local, 0, min(per_group_hits) < num_local")),
    *_equivalent("Scheduler._preempt_request", NO_ENCODER,
                 ("arguments", "request.request_id, None", "None, request.request_id",
                  "self._pending_encoder_input_ids.pop(")),
    *_equivalent("Scheduler._preempt_request", DELIVERY,
                 ("boolean", "drop_stale_output or (\n            request.drop_stale_output and "
                  "request.num_stale_output_tokens > 0\n        )", "((drop_stale_output)\n\n)",
                  "request.drop_stale_output = drop_stale_output or (")),
    *(Survivor("Scheduler._preempt_request", op, original, DELIVERY, replacement=replacement,
               line="request.drop_stale_output and request.num_stale_output_tokens > 0")
      for op, original, replacement in (
          ("boolean", "request.drop_stale_output and request.num_stale_output_tokens > 0",
           "((request.drop_stale_output))"),
          ("boolean", "request.drop_stale_output and request.num_stale_output_tokens > 0",
           "((request.num_stale_output_tokens > 0))"),
          ("comparison", ">", ">="), ("constant", "0", "1"))),
    *_equivalent("Scheduler._preempt_request", WHOLE_PREFILLS,
                 ("constant", "0", "1", "request.num_output_placeholders = 0")),
    *_equivalent("Scheduler._preempt_request", PREEMPTION_COUNT,
                 ("assignment", "+=", "=", "request.num_preemptions += 1"),
                 ("constant", "1", "0", "request.num_preemptions += 1"),
                 ("constant", "1", "2", "request.num_preemptions += 1")),
)

CONFORM = (
    ConformTarget(
        "vllm", "kv_cache_manager_lockstep",
        upstream=(
            Upstream(BLOCK_POOL, (), checked=(
                "BlockHashToBlockMap.get_one_block", "BlockHashToBlockMap.insert", "BlockHashToBlockMap.pop",
                "BlockPool.get_cached_block", "BlockPool.cache_full_blocks", "BlockPool.get_new_blocks",
                "BlockPool._maybe_evict_cached_block", "BlockPool.touch", "BlockPool.free_blocks",
                "BlockPool.reset_prefix_cache", "BlockPool.get_num_free_blocks", "BlockPool.take_events")),
            Upstream(MANAGER, (), checked=(
                "KVCacheManager.get_computed_blocks", "KVCacheManager.allocate_slots", "KVCacheManager.free",
                "KVCacheManager.reset_prefix_cache", "KVCacheManager.take_events")),
            Upstream(SINGLE_TYPE, (), checked=(
                "SingleTypeKVCacheManager.get_num_blocks_to_allocate",
                "SingleTypeKVCacheManager.allocate_new_computed_blocks",
                "SingleTypeKVCacheManager.allocate_new_blocks", "SingleTypeKVCacheManager.cache_blocks",
                "SingleTypeKVCacheManager.free", "FullAttentionManager.find_longest_cache_hit",
                "ChunkedLocalAttentionManager.find_longest_cache_hit",
                "ChunkedLocalAttentionManager.get_num_skipped_tokens")),
        ),
        adapter="kvsim.conform.vllm.manager_lockstep:LOCKSTEP", unreached=UNREACHED,
        survivors=SURVIVORS,
        doc="the real KVCacheManager (one full-attention group) imported from the release, in lockstep with the "
            "model: the hit and new blocks, ref counts, the free queue, block tables and the KV events (hashes "
            "mapped by first appearance) after every schedule, decode, finish, preempt and reset"),
    ConformTarget(
        "vllm", "pd_preemption_race",
        upstream=(Upstream(CORE + "sched/scheduler.py", (), checked=("Scheduler._preempt_request",)),),
        adapter="kvsim.conform.vllm.pd_race:PD_RACE", unreached=SWEEP_UNREACHED, survivors=SWEEP_SURVIVORS,
        doc="vLLM #50297 on the real Scheduler (async scheduling, a producing connector): a producer preempted "
            "while its final step is in flight; finished_into_producer_owns_blocks on request_finished's blocks, "
            "and the model's variant of the release against it"),
    ConformTarget(
        "vllm", "pd_mtp_draft_kv",
        upstream=(Upstream(CORE + "sched/scheduler.py", (), checked=()),
                  Upstream("vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py", (), checked=(
                      "NixlBaseConnectorScheduler._prefill_backoff",
                      "NixlBaseConnectorScheduler._truncate_request_for_prefill"))),
        adapter="kvsim.conform.vllm.pd_mtp:PD_MTP", unreached=SWEEP_UNREACHED, survivors=SWEEP_SURVIVORS,
        doc="vLLM #55055 on the real Scheduler with a multi-module MTP drafter (the release's SpeculativeConfig, "
            "method mtp) and the release's NixlConnector: a producer hands no prompt position whose MTP-layer KV "
            "embeds unverified drafts (no_unverified_draft_kv_handed), and the model's variant of the release "
            "against it"),
    ConformTarget(
        "vllm", "connector_hit_48195",
        upstream=(Upstream(CORE + "kv_cache_manager.py", (), checked=("KVCacheManager.get_computed_blocks_for_connector",)),
                  Upstream(CORE + "kv_cache_coordinator.py", (), checked=()),
                  Upstream(CORE + "sched/scheduler.py", (), checked=())),
        adapter="kvsim.conform.vllm.connector_hit:CONNECTOR_HIT", unreached=SWEEP_UNREACHED,
        survivors=SWEEP_SURVIVORS,
        doc="vLLM #48195 through the real Scheduler.schedule() (full attention + Mamba, a recording KV connector): "
            "the local tokens it hands the connector (0.27.0+ get_computed_blocks_for_connector; 0.26.0 "
            "max(per_group_hits)) are ones full attention caches blocks for (hybrid_hit_backed, the model's "
            "connector_hit_backed on the real record), and the model's variant of the release agrees"),
)
