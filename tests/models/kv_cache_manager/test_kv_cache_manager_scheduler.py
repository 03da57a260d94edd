"""kv-cache-manager-pd, the P/D life cycle of the scheduler around the manager (`scheduler.py`, vLLM #50297):
exhaustive exploration of small configurations (pinned state counts) holding every invariant on `fixed`; the
race found on `pre_50297` as the shortest path; each invariant failing on a planted wrong line (a monkeypatched
method); renaming the blocks a symmetry on every reachable state; the rules agreeing with `enabled`; the
catalog registering the package's second descriptor."""

import pytest

from kvsim.app import catalog
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.runner import run_property
from kvsim.engine.system import run_actions
from kvsim.models.kv_cache_manager import DESCRIPTORS, PD_DESCRIPTOR, scheduler
from kvsim.models.kv_cache_manager.scheduler import RULES, ProducerSchedulerConfig, ProducerSchedulerSystem

from toys import explores_clean, fails_alone, reachable, rotation, symmetry_breaks

# (parameters, states, states with the block renaming reduced) on `fixed`: block_size 2, 2-token prompts unless set
CONFIGS = [
    ({}, 156, 86),  # one producer, one local request (two outputs), two usable blocks
    ({"producers": 2, "local": 1, "num_blocks": 4}, 4861, 891),
    ({"producers": 2, "local": 0, "num_blocks": 2, "prompt_len": 1}, 64, 64),  # one usable block
]
RACE = [scheduler.Schedule(0), scheduler.Schedule(1), scheduler.Output(1), scheduler.Preempt(0), scheduler.Output(0)]


def system(variant="fixed", values=()):
    return PD_DESCRIPTOR.build_system(variant, dict(values))


@pytest.mark.parametrize("values, states, reduced", CONFIGS)
def test_explore_holds_every_invariant_and_liveness_on_fixed(values, states, reduced):
    explores_clean(system("fixed", values), states, reduced)


def test_pre_50297_finishes_a_preempted_producer_with_no_blocks():
    """The race: the producer's final step in flight, a local request's decode needs the block it holds, the
    scheduler preempts it, and the stale output finishes it: request_finished gets no block."""
    (violation,) = explore(system("pre_50297")).violations
    assert violation.property == "finished_into_producer_owns_blocks"
    assert violation.trace == [list(a) for a in RACE]
    assert "request_finished got [], expected the 1 block(s) of its 2 prompt tokens" in violation.message
    s = system("pre_50297")
    *_, last = run_actions(s, RACE)
    assert last.requests[0].status == scheduler.SENDING and last.requests[0].handed == ()
    handed = [e for e in s.transition(run_actions(s, RACE[:-1])[-1], scheduler.Output(0))[1] if e.tag == "handed"]
    assert handed == [scheduler.Handed(0, ())]


@pytest.mark.parametrize("values", [c[0] for c in CONFIGS[1:]])
def test_pre_50297_fails_in_every_configuration(values):
    result = explore(system("pre_50297", values))
    assert [v.property for v in result.violations] == ["finished_into_producer_owns_blocks"]


def test_fixed_drops_the_stale_output_and_hands_the_recomputed_blocks():
    """The same steps on `fixed`: the stale output is dropped, the producer waits, is recomputed once the local
    request has finished, and request_finished gets the block of its prompt, which it holds until delivery."""
    s = system("fixed")
    states = run_actions(s, RACE)
    assert states[-1].requests[0].status == scheduler.WAITING and states[-1].requests[0].stale == 0
    rest = [scheduler.Decode(1), scheduler.Output(1), scheduler.Schedule(0), scheduler.Output(0)]
    last = run_actions(s, RACE + rest)[-1]
    (held,) = [t[0] for t in last.manager.tables if t is not None]
    assert last.requests[0].status == scheduler.SENDING and last.requests[0].handed == held and len(held) == 1
    done = run_actions(s, RACE + rest + [scheduler.Deliver(0)])[-1]
    assert s.done(done)


def _hand_then_free(self, m, r, req, fx):
    """A planted finish: the connector gets the blocks, and they are freed at once (no delay_free_blocks)."""
    after = ORIGINAL_FINISH(self, m, r, req, fx)
    if after.status == scheduler.SENDING:
        m.free(req)
    return after


ORIGINAL_FINISH = ProducerSchedulerSystem.finish


def _free_forgets_ref(self, m, r, req, fx):  # a request's blocks leave its table with their ref_cnt kept
    (full,) = m.coordinator.single_type_managers
    full.pop_blocks_for_free(r)


def _free_keeps_tail(self, m, r, req, fx):  # the request's last block is never given back to the pool
    (full,) = m.coordinator.single_type_managers
    m.block_pool.free_blocks(reversed(full.pop_blocks_for_free(r)[:-1]))


def _no_backoff(self, req, backoff=0, spares_skip_reading=True):  # the producer's prompt is never truncated
    return (1 + req,) * self.prompt_len


# invariant -> (object, attribute, wrong value, parameters): each plant breaks its invariant on `fixed`
PLANTS = {
    "finished_into_producer_owns_blocks": (ProducerSchedulerSystem, "finish", _hand_then_free, {}),
    "ref_count_is_holders": (ProducerSchedulerSystem, "free", _free_forgets_ref, {}),
    "all_free_when_done": (ProducerSchedulerSystem, "free", _free_keeps_tail, {}),
    "no_unverified_draft_kv_handed": (ProducerSchedulerConfig, "prompt", _no_backoff, {"mtp_lookahead": 2}),
}


def test_every_invariant_but_the_pool_checks_has_a_planted_line():
    """The pool's own checks (`free_queue_iff_unreferenced`, `pool_accounting`) are CacheManagerSystem's, planted
    in its tests; this system's own invariants and the reference counts are planted here."""
    names = {i.name for i in ProducerSchedulerSystem().invariants}
    assert set(PLANTS) | {"free_queue_iff_unreferenced", "pool_accounting"} == names


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_each_invariant_fails_alone_on_its_planted_line(name, monkeypatch):
    where, attribute, wrong, values = PLANTS[name]
    fails_alone(lambda: system(values=values), name, (where, attribute, wrong), monkeypatch)


# -- #55055: the producer stops the MTP drafter's lookahead window short ---------------------------------------
LOOKAHEAD = [({"mtp_lookahead": 2}, 67), ({"mtp_lookahead": 3, "prompt_len": 3}, 116), ({"mtp_lookahead": 1}, 86)]


@pytest.mark.parametrize("values, reduced", LOOKAHEAD)
def test_fixed_hands_no_draft_kv_for_any_lookahead(values, reduced):
    result = explore(system("fixed", values))
    assert result.violations == [] and result.hang_states == 0 and result.states == reduced


@pytest.mark.parametrize("values", [v for v, _ in LOOKAHEAD[:2]])
def test_pre_55055_hands_the_draft_kv_in_two_steps(values):
    (violation,) = explore(system("pre_55055", values)).violations
    assert violation.property == "no_unverified_draft_kv_handed"
    assert violation.trace == [["schedule", 0], ["output", 0]]
    assert "MTP drafter's KV of unverified draft tokens" in violation.message


def test_an_eagle_drafter_needs_no_backoff():
    """Lookahead 1 (Eagle reads only the next token, the sampled one): no backoff, before the fix or after."""
    for variant in ("fixed", "pre_55055"):
        s = system(variant, {"mtp_lookahead": 1})
        assert s.backoff == 0 and explore(s).violations == []


def test_the_fix_truncates_only_producer_prompts_longer_than_the_backoff():
    assert system("fixed", {"mtp_lookahead": 3, "prompt_len": 3}).prompts == ((1,), (2, 2, 2))
    assert system("fixed", {"mtp_lookahead": 3, "prompt_len": 2}).prompts == ((1, 1), (2, 2))  # not longer
    assert system("pre_55055", {"mtp_lookahead": 3, "prompt_len": 3}).prompts == ((1, 1, 1), (2, 2, 2))


def test_a_producer_asking_for_prompt_logprobs_is_truncated_only_by_0_31():
    """A producer that skips reading the prefix cache (prompt logprobs): 0.32.0's P side does not truncate it, as
    its decode side (0.31.0 on, #57269) loads nothing and recomputes the whole prompt; 0.31.0 truncated it as any
    other. Either way no draft KV reaches the decode side's cache, while 0.30.0's decode side loads the handed
    prompt whole, draft KV included."""
    values = {"mtp_lookahead": 2, "prompt_len": 3, "prompt_logprobs": 1, "num_blocks": 4}
    assert system("fixed", values).prompts == ((1, 1, 1), (2, 2, 2))
    assert system("truncates_skip_reading", values).prompts == ((1, 1), (2, 2, 2))
    for variant in ("fixed", "truncates_skip_reading"):
        assert explore(system(variant, values)).violations == [], variant
    (violation,) = explore(system("pre_55055", values)).violations
    assert violation.property == "no_unverified_draft_kv_handed" and violation.trace == [["schedule", 0], ["output", 0]]


def test_a_request_that_skips_reading_the_prefix_cache_finds_no_hit():
    """Its lookup is empty although its prompt is cached (`prefix_cache_lookup_enabled`); without the flag the same
    prompt hits its cached block."""
    from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager, Request

    m = KVCacheManager(4, 2, 2)
    first = Request(0, [1, 1, 1], 3, 0, 2)
    m.allocate_slots(first, 3)
    m.free(first)
    assert m.get_computed_blocks(Request(1, [1, 1, 1], 3, 0, 2))[1] == 2
    blocks, hit = m.get_computed_blocks(Request(1, [1, 1, 1], 3, 0, 2, True))
    assert hit == 0 and blocks == ([],)


@pytest.mark.parametrize("args, tokens", [
    ((0, 4, 4, 4, 1), 3),  # a prompt of 4 in blocks of 1: its last cacheable state is at 3 (vLLM 0.33.0 runs 3)
    ((0, 4, 4, 4, 1, 1), 1),  # a shared-prefix junction at 1 inside the chunk: the split stops there
    ((0, 5, 5, 5, 2, 1), 4),  # ... floored to a block from the start: at 0, not inside the chunk
    ((0, 5, 5, 5, 2), 4),  # blocks of 2: the last cacheable boundary below 5 - 1
    ((1, 4, 5, 5, 2), 1),  # a chunk starting inside a block stops at its end
    ((0, 3, 7, 7, 2), 2),  # a chunk that does not end the prefill ends on a block boundary
    ((5, 1, 5, 6, 2), 1),  # a decode (past the prefill) is not split
])
def test_the_mamba_split_stops_where_the_scheduler_stops(args, tokens):
    assert scheduler.mamba_block_aligned_split(*args) == tokens


def test_a_pool_too_small_for_one_prompt_is_a_hang():
    result = explore(system("fixed", {"num_blocks": 2, "prompt_len": 3}))
    assert [v.property for v in result.violations] == ["every_request_finishes"]


@pytest.mark.parametrize("variant, values", [("fixed", {}), ("fixed", CONFIGS[1][0]), ("pre_50297", CONFIGS[1][0])])
def test_renaming_the_blocks_is_a_symmetry_on_every_reachable_state(variant, values):
    s = system(variant, values)
    perm = rotation(s.cfg.num_blocks)
    states = reachable(s)
    assert len(states) > 25
    assert symmetry_breaks(s, states, lambda state: scheduler.relabel(state, perm)) is None
    if variant == "pre_50297":  # with and without the reduction: one violation, one trace length
        full, reduced = explore(s, ExploreOptions(symmetry=False)), explore(s, ExploreOptions())
        assert [len(v.trace) for v in full.violations] == [len(v.trace) for v in reduced.violations] == [6]


@pytest.mark.parametrize("variant", ["fixed", "pre_50297"])
def test_allows_is_membership_in_enabled(variant):
    actions, wrong = RULES.disagreements(system(variant, CONFIGS[1][0]))
    assert {a.tag for a in actions} == {"schedule", "decode", "output", "preempt", "deliver"}
    assert not wrong


def test_the_config_refuses_what_the_model_cannot_run():
    with pytest.raises(Exception, match="producers"):
        ProducerSchedulerConfig(producers=0, local=0)
    with pytest.raises(Exception, match="producers"):
        ProducerSchedulerConfig(producers=3, local=1)


def test_the_catalog_registers_both_systems_of_the_package():
    reg = catalog.models()
    assert [reg.model(d.name) for d in DESCRIPTORS] == list(DESCRIPTORS)
    assert reg.model("kv-cache-manager-pd").variants.names == ("fixed", "pre_50297", "pre_55055",
                                                               "truncates_skip_reading")
    assert reg.model("kv-cache-manager").variants.names == ("fixed", "mamba_all", "pre_48195")
    assert isinstance(reg.model("kv-cache-manager-pd").build_system("fixed"), ProducerSchedulerSystem)


# -- the stateful property and the bug report -----------------------------------------------------------------
PROP = {p.name: p for p in catalog.load().properties_of("kv-cache-manager-pd")}["pd_scheduler_invariants"]


def test_the_stateful_property_holds_on_fixed_and_fails_on_pre_50297():
    assert run_property(PROP, "fixed", max_examples=60, derandomize=True).status == "passed"
    failed = run_property(PROP, "pre_50297", max_examples=200, derandomize=True)
    assert failed.status == "failed" and "finished_into_producer_owns_blocks" in failed.message


def test_the_bug_report_reproduces_on_pre_50297_and_holds_on_its_fix():
    bug = catalog.load().bug("vllm-50297-pd-preemption-race")
    assert (bug.model, bug.variant, bug.invariant, bug.fix_variant) == \
        ("kv-cache-manager-pd", "pre_50297", "finished_into_producer_owns_blocks", "fixed")
    for variant, violated in ((bug.variant, ["finished_into_producer_owns_blocks"]), (bug.fix_variant, [])):
        result = explore(PD_DESCRIPTOR.build_system(variant, dict(bug.params)))
        assert [v.property for v in result.violations] == violated


def test_a_prompt_no_longer_than_the_backoff_is_handed_whole_after_the_fix_too():
    """What the model says of 0.31.0's guard (`request.num_prompt_tokens > backoff`): a 2-token prompt under
    lookahead 3 is not truncated, so its draft-derived MTP KV is handed. The model's reading of the source, not
    run on the real code (the NIXL scheduler side does not import with the manager's dependency table)."""
    (violation,) = explore(system("fixed", {"mtp_lookahead": 3, "prompt_len": 2})).violations
    assert violation.property == "no_unverified_draft_kv_handed" and len(violation.trace) == 2


def test_the_55055_bug_report_reproduces_on_pre_55055_and_holds_on_its_fix():
    bug = catalog.load().bug("vllm-55055-pd-mtp-draft-kv")
    assert (bug.variant, bug.fix_variant, dict(bug.params)) == ("pre_55055", "fixed", {"mtp_lookahead": 2})
    for variant, violated in ((bug.variant, ["no_unverified_draft_kv_handed"]), (bug.fix_variant, [])):
        assert [v.property for v in explore(PD_DESCRIPTOR.build_system(variant, dict(bug.params))).violations] \
            == violated
