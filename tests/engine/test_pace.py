"""How often the long loops read the wall clock (`kvsim.engine.pace`): fast steps rarely, slow steps every step, so a
run of slow steps stops at its budget with what it found. The clock here is a stand-in that the steps move."""

from types import SimpleNamespace

from kvsim.engine import pace as pace_module, sim as sim_module
from kvsim.engine.explore import ExploreOptions, explore
from kvsim.engine.explore import search as search_module
from kvsim.engine.pace import Pace
from kvsim.engine.sim import Simulator
from toys import Counter


class Clock:
    """Seconds that move only when told; counts its reads."""

    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def perf_counter(self) -> float:
        self.reads += 1
        return self.now


def test_pace_reads_fast_steps_every_few_thousand_and_slow_steps_every_one():
    clock = Clock()
    pace = Pace(clock.perf_counter)
    seen = []
    for _ in range(16):  # steps of a microsecond: twice as many each read, up to EVERY
        clock.now += pace.every * 1e-6
        pace.read()
        seen.append(pace.every)
    assert seen[:4] == [2, 4, 8, 16] and seen[-1] == pace_module.EVERY and max(seen) == pace_module.EVERY
    clock.now += pace.every * 0.01  # then steps of 10 ms: as many as last SPACING (0.02 s), at once
    pace.read()
    assert pace.every == 2
    clock.now += 2 * 0.5  # slower than the spacing: every step
    pace.read()
    assert pace.every == 1
    pace.read()  # no time passed: twice as many, not all at once
    assert pace.every == 2


def test_a_simulation_of_slow_events_stops_at_its_budget(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sim_module, "_clock", clock)
    sim = Simulator(0, max_seconds=1.0)

    def slow() -> None:  # each event lasts 50 ms
        clock.now += 0.05

    for t in range(5000):
        sim.schedule(t, slow)
    sim.run()
    # stopped within an event of the budget (read every 4,096 events: 204 s, past the command line's alarm)
    assert sim.stopped_by == "max-seconds" and 20 <= sim.events_run <= 21 and clock.now <= 1.05 + 1e-9


def test_a_simulation_of_fast_events_reads_the_clock_rarely(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sim_module, "_clock", clock)
    sim = Simulator(0, max_seconds=60.0)

    def fast() -> None:  # each event lasts a microsecond
        clock.now += 1e-6

    for t in range(100_000):
        sim.schedule(t, fast)
    sim.run()
    assert sim.stopped_by is None and sim.events_run == 100_000
    assert clock.reads <= 100_000 // pace_module.EVERY + 16  # the ramp to EVERY, then every EVERY events


class SlowCounter(Counter):
    """Counter whose every step lasts 10 ms of `clock`."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(limit=1_000_000, bad=None)
        self.clock = clock

    def step(self, state, action):
        self.clock.now += 0.01
        return super().step(state, action)


def test_a_search_of_slow_states_stops_at_its_budget_with_what_it_found(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(search_module, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    result = explore(SlowCounter(clock), ExploreOptions(max_seconds=1.0, check_liveness=False))
    # stopped within a state (two steps) of the budget: 101 steps, not the 4,096 states expanded first before
    assert result.bound_hit == "seconds" and result.transitions <= 102 and 1.0 <= clock.now <= 1.03
