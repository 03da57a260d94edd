"""pipelined-transfer: chunk coordinates (TensorRT-LLM #15727, research note section 1.4), pinned cases and
properties, each shown failing on a planted mutation."""

import pytest

from kvsim.app import catalog
from kvsim.engine.errors import ConfigError, PropertyViolation
from kvsim.engine.runner import run_property
from kvsim.models.pipelined_transfer import chunks as ch
from kvsim.models.pipelined_transfer import gates
from kvsim.models.pipelined_transfer.gates import TransceiverSetup, resolve_pipelined_transfer, validate_request
from kvsim.models.pipelined_transfer.variants import FIXED
from kvsim.properties.pipelined_transfer import cases
from kvsim.properties.pipelined_transfer import chunks as props
from kvsim.properties.pipelined_transfer import gates as gate_props

REG = catalog.load()
MODEL = "pipelined-transfer"
CHUNK_PROPERTIES = ("slices_cover_every_block", "token_ranges_follow_blocks", "receiver_blocks_projected",
                    "deferred_chunks_emit_no_slice", "projection_is_the_overlap")


# -- pinned upstream cases ------------------------------------------------------------------------------

def test_revision_b_boundary_example():
    """tpb 4, 8 blocks, token chunks (0,6), (6,12), (12,32): spans [0,2), [1,3), [3,8); neighbours share one."""
    assert cases.B_BOUNDARY.spans() == cases.B_BOUNDARY_SPANS == [(0, 2), (1, 3), (3, 8)]
    # revision A floors the non-final ends: the partial block goes with the next chunk
    a = ch.extents_of(((0, 6), (6, 12), (12, 32)), 32, 4, 0, "A")
    assert [(e.block_start, e.block_end) for _, e in a] == [(0, 1), (1, 3), (3, 8)]


def test_revision_a_worked_example_reuse_prefix_travels_with_slice_0():
    slices = cases.A_WORKED.slices()
    assert cases.A_WORKED.spans() == [(0, 6), (6, 8)]
    assert [s.is_last for s in slices] == [False, True]
    assert slices[0].extent.token_range == ch.TokenRange(0, 24)
    assert slices[1].extent.token_range == ch.TokenRange(24, 32)


def test_prefix_sent_and_monolithic_slice():
    assert cases.B_PREFIX_SENT.spans() == [(3, 6), (6, 8)]
    assert cases.MONOLITHIC.spans() == [(0, 8)] and cases.MONOLITHIC.slices()[0].is_last


def test_first_and_last_chunk_rules_and_empty_chunks():
    assert ch.is_first_chunk(12, 12) and not ch.is_first_chunk(13, 12)
    assert ch.is_last_chunk(0) and not ch.is_last_chunk(1)
    # a non-final chunk inside one block emits nothing in revision A (no slice id consumed) ...
    assert ch.chunk_extent(5, 7, prepopulated_prompt_len=0, context_remaining_length=3, tokens_per_block=4,
                           prompt_len=10) is None
    # ... and the block once more in revision B
    b = ch.chunk_extent(5, 7, prepopulated_prompt_len=0, context_remaining_length=3, tokens_per_block=4,
                        prompt_len=10, boundary="B")
    assert (b.block_start, b.block_end) == (1, 2)
    spans = ch.extents_of(((0, 5), (5, 7), (7, 10)), 10, 4, 0, "A")
    assert [None if e is None else (e.block_start, e.block_end) for _, e in spans] == [(0, 1), None, (1, 3)]
    last = ch.chunk_extent(8, 10, prepopulated_prompt_len=0, context_remaining_length=0, tokens_per_block=4,
                           prompt_len=10)
    assert last.token_range == ch.TokenRange(8, 10) and last.is_last


def test_final_slice_emitted_even_when_it_carries_nothing():
    """A short group resident only up to block 2: the final chunk [2, 4) projects to nothing but is emitted."""
    case = cases.ChunkCase(8, 2, ((0, 4), (4, 8)), groups=(cases.GroupSpec(2, 2),))
    slices = case.slices()
    assert [s.is_last for s in slices] == [False, True]
    assert slices[1].block_ids_per_layer_groups == ((-1, -1, -1, -1),)
    assert slices[0].block_ids_per_layer_groups == ((1000, 1001, -1, -1),)


def test_short_group_swa_group_and_receiver_mask():
    got = [s.block_ids_per_layer_groups for s in cases.SHORT_AND_SWA.slices()]
    assert got == [
        ((-1, -1, -1, -1, -1), (-1, -1, -1, -1, -1), (-1, -1, -1, -1, -1)),  # block 0 is receiver-cached
        ((-1, 1001, 1002, -1, -1), (-1, -1, 2000, -1, -1), (-1, -1, -1, -1, -1)),
        ((-1, -1, -1, 1003, 1004), (-1, -1, -1, 2001, -1), (-1, -1, -1, 3003, 3004)),  # SWA: final window
    ]


def test_all_swa_non_final_chunk_emits_no_slice():
    """Issue 30: every layer group a window shorter than the prompt: chunk 0 holds no id on the sender, so upstream's
    `_build_prefill_extent` returns None and the final chunk's slice is slice 0; beside a full-attention group chunk
    0 is emitted, the window group -1 in it."""
    assert cases.ALL_SWA.per_chunk()[0] is None
    (only,) = cases.ALL_SWA.slices()
    assert (only.slice_id, only.is_last, only.block_ids_per_layer_groups) == (0, True, ((-1, -1, 1002),))
    both = cases.ChunkCase(6, 2, ((0, 3), (3, 6)), groups=(cases.GroupSpec(3, 3), cases.GroupSpec(3, 3, window=2)))
    assert [s.block_ids_per_layer_groups for s in both.slices()] == [((1000, -1, -1), (-1, -1, -1)),
                                                                     ((-1, 1001, 1002), (-1, -1, 2002))]


def test_project_blocks_to_global_chunk():
    ids = (10, 11, 12)  # resident suffix of [0, 5): global blocks 2, 3, 4
    assert ch.project_blocks_to_global_chunk(ids, 0, 3, 5) == (10,)
    assert ch.project_blocks_to_global_chunk(ids, 3, 4, 5) == (11, 12)
    assert ch.project_blocks_to_global_chunk(ids, 0, 2, 5) == ()  # before the resident range
    assert ch.project_blocks_to_global_chunk(ids, 1, 0, 5) == ()
    assert ch.project_blocks_to_global_chunk((), 0, 4, 5) == ()
    assert ch.positional_blocks(ids, 1, 3, 5, 6) == (-1, -1, 10, 11, -1, -1)
    assert ch.mask_receiver_cached((5, 6, 7), 2) == (-1, -1, 7)
    assert list(ch.swa_window_blocks(10, 2, 4)) == [3, 4] and ch.is_pipelined_group(10, 10)


def test_bad_boundary_and_token_range():
    with pytest.raises(ConfigError, match="boundary"):
        ch.chunk_extent(0, 4, prepopulated_prompt_len=0, context_remaining_length=0, tokens_per_block=2,
                        prompt_len=4, boundary="C")
    with pytest.raises(ConfigError):
        ch.TokenRange(3, 2)


# -- properties: pass on the pinned cases and generated ones, fail on planted mutations -----------------

@pytest.mark.parametrize("name", CHUNK_PROPERTIES)
def test_chunk_properties_pass(name):
    result = run_property(REG.property(MODEL, name), FIXED, max_examples=80, seed=0)
    assert result.status == "passed", result.message


def _fails(prop, case):
    with pytest.raises(PropertyViolation) as err:
        prop(case, FIXED)
    return str(err.value)


def test_coverage_fails_when_b_rounds_past_one_block(monkeypatch):
    real = ch.chunk_extent

    def over(*a, **kw):
        e = real(*a, **kw)
        return e if e is None or e.is_last else ch.ChunkExtent(e.block_start, e.block_end + 1, e.token_range, False)
    monkeypatch.setattr(ch, "chunk_extent", over)
    assert "at most 1 shared block, got overlap 2" in _fails(props.slices_cover_every_block, cases.B_BOUNDARY)


def test_coverage_fails_when_a_does_not_floor(monkeypatch):
    real = ch.chunk_extent
    monkeypatch.setattr(ch, "chunk_extent", lambda *a, **kw: real(*a, **{**kw, "boundary": "B"}))
    assert "revision A" in _fails(props.slices_cover_every_block, cases.ChunkCase(32, 4, ((0, 6), (6, 32))))


def test_coverage_fails_without_the_final_slice(monkeypatch):
    real = ch.chunk_extent
    monkeypatch.setattr(ch, "chunk_extent", lambda *a, **kw: None if kw["context_remaining_length"] == 0
                        else real(*a, **kw))
    assert "is_last" in _fails(props.slices_cover_every_block, cases.A_WORKED)


def test_token_range_property_fails_on_a_wrong_end(monkeypatch):
    real = ch.chunk_extent

    def wrong(*a, **kw):
        e = real(*a, **kw)
        return e and ch.ChunkExtent(e.block_start, e.block_end, ch.TokenRange(e.token_range.start, 99), e.is_last)
    monkeypatch.setattr(ch, "chunk_extent", wrong)
    assert "token range" in _fails(props.token_ranges_follow_blocks, cases.A_WORKED)


def test_projection_property_fails_without_the_mask_or_with_swa_pipelined(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(ch, "mask_receiver_cached", lambda ids, cached: tuple(ids))
        assert "group 0" in _fails(props.receiver_blocks_projected, cases.SHORT_AND_SWA)
    with monkeypatch.context() as m:
        m.setattr(ch, "is_pipelined_group", lambda prompt_len, window: True)
        assert "group 2" in _fails(props.receiver_blocks_projected, cases.SHORT_AND_SWA)


def test_deferred_chunk_properties_fail_when_an_all_masked_chunk_is_emitted(monkeypatch):
    monkeypatch.setattr(ch, "all_deferred", lambda prompt_len, groups: False)
    assert "expected slices from chunks [1], got [0, 1]" in _fails(props.deferred_chunks_emit_no_slice,
                                                                   cases.ALL_SWA)
    assert "final slice only" in _fails(props.slices_cover_every_block, cases.ALL_SWA)


def test_projection_property_fails_on_an_off_by_one(monkeypatch):
    real = ch.project_blocks_to_global_chunk
    monkeypatch.setattr(props, "project_blocks_to_global_chunk", lambda ids, o, n, e: real(ids, o + 1, n, e))
    assert "expected [7, 8]" in _fails(props.projection_is_the_overlap, (3, 3, 0, 2, 4))


# -- S10: the configuration gates ------------------------------------------------------------------------

def test_gates_pinned():
    assert resolve_pipelined_transfer(TransceiverSetup()) == resolve_pipelined_transfer(
        TransceiverSetup(transceiver_runtime="PYTHON"))
    assert resolve_pipelined_transfer(TransceiverSetup()).runtime == "PYTHON"
    assert resolve_pipelined_transfer(TransceiverSetup(pipeline_parallel_size=2, role="generation")).refusals == ()
    assert len(resolve_pipelined_transfer(TransceiverSetup(pipeline_parallel_size=2)).refusals) == 1
    assert "bounce" in resolve_pipelined_transfer(TransceiverSetup(kv_cache_bounce_size_mb=64)).refusals[0]
    assert resolve_pipelined_transfer(TransceiverSetup(kv_cache_bounce_size_mb=64,
                                                       agent_bounce_buffer_enable=True)).refusals == ()
    assert validate_request(1, None) is None and validate_request(1, "CONTEXT_FIRST")


def test_gates_property_passes_and_fails_without_the_cp_gate(monkeypatch):
    assert run_property(REG.property(MODEL, "gates_refuse_unsupported_setups"), FIXED, max_examples=80,
                        seed=0).status == "passed"
    real = gates.resolve_pipelined_transfer

    def no_cp(setup):
        res = real(setup)
        return gates.Resolution(res.runtime, tuple(r for r in res.refusals if "cp_size" not in r))
    monkeypatch.setattr(gate_props, "resolve_pipelined_transfer", no_cp)
    with pytest.raises(PropertyViolation, match="CP > 1"):
        gate_props.gates_refuse_unsupported_setups(gates.TransceiverSetup(cp_size=2), FIXED)
