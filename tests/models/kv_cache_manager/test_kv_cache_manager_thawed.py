"""A transition from the state the last one froze to takes the manager that one left (`kvsim.engine.system.Thawed`), and
a pool keeps its value until a method changes it (`BlockPool.freeze`): both are exact.

A random walk over each system (hybrid groups, resets, the variants, the P/D producer's scheduler) steps every state
both ways, with the manager kept and with one thawed afresh from the state, and asks for the same successor and
effects; the manager kept then freezes, with its pool's value taken anew, to that successor (a method that changed
the pool and left its old value would be caught here). A simulation thaws once, at its initial state.
"""

import pytest
from toys import kept_walk

from kvsim.app.simulate import simulate_model
from kvsim.models.kv_cache_manager import DESCRIPTOR, PD_DESCRIPTOR
from kvsim.models.kv_cache_manager.block_pool import BlockPool
from kvsim.models.kv_cache_manager.kv_cache_manager import KVCacheManager
from kvsim.models.kv_cache_manager.kv_cache_utils import request_block_hashes
from kvsim.models.kv_cache_manager.scheduler import ProducerSchedulerConfig, ProducerSchedulerSystem
from kvsim.models.kv_cache_manager.system import CacheManagerConfig, CacheManagerSystem
from kvsim.models.kv_cache_manager.variants import PD_VARIANTS, VARIANTS


def anew(manager, frozen):
    """The kept manager, its pool's value taken anew from the blocks, the queue and the map, is `frozen`."""
    manager.block_pool.frozen = manager.block_pool.frozen_map = None
    return manager.freeze() == frozen


def walk(make, steps, seed):
    return kept_walk(make, steps, seed, anew)


def test_each_change_to_a_pool_drops_the_value_it_kept():
    """Each method that changes a pool, one after another, and the value it freezes to taken anew."""
    pool = BlockPool(6)
    values = [pool.freeze()]
    assert pool.freeze() is values[0]  # kept while nothing changes
    held: list = []

    def take(n):
        held[:] = pool.get_new_blocks(n)

    changes = [
        lambda: take(2),
        lambda: pool.cache_full_blocks(request_block_hashes([1, 2, 3, 4], 2), held, 0, 2, 2),
        lambda: pool.free_blocks(reversed(held)),
        lambda: pool.touch(held[:1]),
        lambda: pool.free_blocks(held[:1]),
        pool.reset_prefix_cache,
        lambda: take(2),
        lambda: pool.cache_full_blocks(request_block_hashes([1, 2, 3, 4], 2), held, 0, 2, 2),
        lambda: pool.free_blocks(reversed(held)),
        lambda: take(5),  # every free block: the two cached ones evicted
    ]
    for k, change in enumerate(changes):
        change()
        value = pool.freeze()
        pool.frozen = pool.frozen_map = None
        assert value == pool.freeze() != values[-1], k
        values.append(value)
    assert values[-1].cached == () and set(values[-1].hashes) == {None} and values[6].cached == ()
    assert BlockPool.thaw(values[-1]).freeze() is values[-1]  # a thawed pool's value is the one it was thawed from


@pytest.mark.parametrize("variant,params", [
    ("fixed", {"num_blocks": 5, "prompts": (0, 1, 0), "resets": 2}),
    ("fixed", {"num_blocks": 5, "prompts": (0, 1, 0), "resets": 2, "lookahead": 1}),
    ("fixed", {"num_blocks": 10, "groups": "full,swa,mamba", "prompt_len": 4, "max_tokens": 3}),
    ("mamba_all", {"num_blocks": 10, "groups": "full,mamba", "prompt_len": 5, "block_size": 1}),
    ("pre_48195", {"num_blocks": 10, "groups": "full,local", "prompt_len": 6, "block_size": 2,
                   "attention_chunk_size": 4}),
])
def test_a_kept_manager_steps_as_a_thawed_one(variant, params):
    config = CacheManagerConfig(**params)
    kept = walk(lambda: CacheManagerSystem(VARIANTS[variant], config), 600, seed=len(params))
    assert kept > 300


@pytest.mark.parametrize("variant", ["fixed", "pre_50297"])
def test_the_producers_scheduler_keeps_its_manager_exactly_too(variant):
    config = ProducerSchedulerConfig(num_blocks=5, producers=2, mtp_lookahead=1)
    kept = walk(lambda: ProducerSchedulerSystem(PD_VARIANTS[variant], config), 600, seed=1)
    assert kept > 300


@pytest.mark.parametrize("spec", [DESCRIPTOR, PD_DESCRIPTOR], ids=["kv-cache-manager", "kv-cache-manager-pd"])
def test_a_simulation_thaws_only_its_initial_state(spec, monkeypatch):
    thaw, thaws = KVCacheManager.thaw, []

    def counted(*args, **kwargs):
        thaws.append(1)
        return thaw(*args, **kwargs)

    monkeypatch.setattr(KVCacheManager, "thaw", counted)
    result = simulate_model(spec, "fixed", 0, {"requests": 40})
    assert len(result.driver.actions) > 200 and len(thaws) == 1
