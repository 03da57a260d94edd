"""A data property's reachability declarations (`kv_property(sometimes=...)`): each is asked of the cases the
property's strategy draws (not of its pinned ones) until one meets it, and is reported reached (with that case and
its number), unreached after the whole default budget, or not reached within a smaller budget or before a failure;
`kvsim check` fails a property that held but never drew what it declares, and every model declares some."""

import dataclasses
import importlib
import json

import pytest
from hypothesis import strategies as st

from kvsim import models
from kvsim.app import catalog, cli
from kvsim.engine.errors import PropertyViolation
from kvsim.engine.property import kv_property
from kvsim.engine.runner import run_property
from kvsim.engine.system import NOT_WITHIN_BOUND, REACH_EXAMPLES, REACHED, UNREACHED, Sometimes, sometimes

MODEL = catalog.models().model("mla-chunks")  # any registered model: the toy properties below name it
HALF = 10 ** 6  # a range the budget cannot exhaust (Hypothesis stops early where it has drawn every value)


def toy(asked: list | None = None, fails_at: int | None = None, examples: tuple = ()):
    def zero(x: int) -> bool:
        if asked is not None:
            asked.append(x)
        return x == 0

    goals = (Sometimes("zero", zero, "a zero is drawn"), Sometimes("negative", lambda x: x < 0, "below 0"),
             Sometimes("above_half", lambda x: x > HALF, "above half the range"))

    @kv_property(model=MODEL.name, strategy=st.integers(0, 2 * HALF), examples=examples, sometimes=goals)
    def toy_property(x: int, variant) -> None:
        """x stays off `fails_at`."""
        if x == fails_at:
            raise PropertyViolation(f"x is {fails_at}")

    return toy_property


def run(prop, **kw):
    return run_property(prop, "fixed", seed=0, descriptor=MODEL, **kw)


def rows(result) -> list:
    return [(g["name"], g["status"]) for g in result.reachability]


def test_each_declaration_is_met_by_a_drawn_case_or_unreached_after_the_default_budget():
    result = run(toy(), max_examples=REACH_EXAMPLES)
    assert result.status == "passed"
    assert rows(result) == [("zero", REACHED), ("negative", UNREACHED), ("above_half", REACHED)]
    zero, negative, above = result.reachability
    assert zero["case"] == 0 and above["case"] > HALF and 1 <= zero["example"] and 1 <= above["example"]
    assert negative["example"] is None and negative["case"] is None and negative["drawn"] == REACH_EXAMPLES
    assert zero["doc"] == "a zero is drawn"
    assert all(g["reached"] == (g["status"] == REACHED) for g in result.reachability)
    assert result.to_json()["reachability"] == list(result.reachability)


def test_the_witness_is_the_first_drawn_case_that_met_it():
    kept = run(toy(), max_examples=REACH_EXAMPLES, keep_tried=True)
    above = kept.reachability[2]
    assert kept.tried[above["example"] - 1] == above["case"]
    assert all(x <= HALF for x in kept.tried[:above["example"] - 1])


def test_fewer_examples_or_a_failure_leave_a_declaration_not_reached_within_the_bound():
    assert rows(run(toy(), max_examples=REACH_EXAMPLES - 1))[1] == ("negative", NOT_WITHIN_BOUND)
    failed = run(toy(fails_at=0), max_examples=REACH_EXAMPLES)
    assert failed.status == "failed" and rows(failed)[1] == ("negative", NOT_WITHIN_BOUND)


def test_pinned_cases_are_not_asked():
    result = run(toy(examples=(-5, HALF + 1)), max_examples=REACH_EXAMPLES)
    assert rows(result)[1] == ("negative", UNREACHED)  # the pinned -5 ran, but the strategy never draws it
    assert result.examples == REACH_EXAMPLES + 2 and result.reachability[1]["drawn"] == REACH_EXAMPLES


def test_a_declaration_is_asked_only_until_it_is_met():
    asked: list = []
    result = run(toy(asked=asked), max_examples=REACH_EXAMPLES)
    assert asked[-1] == 0 and 0 not in asked[:-1] and len(asked) == result.reachability[0]["example"]


@pytest.mark.parametrize("how", [{"seed": 0}, {"derandomize": True, "seed": None}])
def test_declarations_do_not_change_what_is_drawn(how):
    with_goals = toy()
    without = dataclasses.replace(with_goals, sometimes=())
    kw = {"max_examples": 60, "keep_tried": True, **how}
    first = run_property(with_goals, "fixed", descriptor=MODEL, **kw)
    second = run_property(without, "fixed", descriptor=MODEL, **kw)
    assert first.tried == second.tried and len(first.tried) == 60 and second.reachability == ()


# -- every model --------------------------------------------------------------------------------------------------

def built_in() -> list[str]:
    """The catalog's own models (`kvsim.models.MODELS`), not the toys other test modules register."""
    names = []
    for package in models.MODELS:
        module = importlib.import_module(f"kvsim.models.{package}")
        names += [d.name for d in getattr(module, "DESCRIPTORS", (module.DESCRIPTOR,))]
    return names


def test_every_model_declares_what_some_path_or_some_drawn_case_must_reach():
    reg = catalog.load()
    for model in map(reg.model, built_in()):
        system = sometimes(model.build_system("fixed")) if model.system is not None else ()
        data = [g for p in reg.properties_of(model.name) for g in p.sometimes]
        assert system or data, model.name
        assert all(g.doc for g in data), model.name


# one property of each distinct (strategy, declarations) pair: the default budget meets every declaration
DRAWN = [("mla-chunks", "chunks_tile_every_context_row_once"), ("mla-chunks", "dcp_reorg_matches_chunk_spans"),
         ("mla-chunks", "context_partial_matches_context_attention"),
         ("mla-chunks", "uniform_and_per_request_plans_agree"), ("kv-zeroing", "zeroed_blocks_are_cleared"),
         ("swa-budget", "resumed_requests_fit_physical_pages"), ("mla-backends", "empty_states_merge_to_empty"),
         ("pd-staging", "grid_is_whole_pages"), ("pd-staging", "ring_assign_in_bounds"),
         ("kv-offload", "capacity_and_free_list_hold"), ("pipelined-transfer", "slices_cover_every_block"),
         ("mla-backends", "dense_csr_dense_round_trip"), ("mla-backends", "auto_order_is_complete")]


def test_the_sample_covers_every_declaring_strategy():
    reg = catalog.load()
    pairs = {(p.model, p.strategy, p.sometimes) for (m, _), p in reg.properties.items() if p.sometimes}
    assert pairs == {(m, reg.property(m, n).strategy, reg.property(m, n).sometimes) for m, n in DRAWN}


@pytest.mark.parametrize("model, prop", DRAWN, ids=[p for _, p in DRAWN])
def test_the_default_budget_meets_every_declaration(model, prop):
    declared = catalog.load().property(model, prop)
    result = run_property(declared, "fixed", max_examples=REACH_EXAMPLES, seed=0)
    assert result.status == "passed"
    assert [g["name"] for g in result.reachability] == [g.name for g in declared.sometimes]
    for goal, found in zip(declared.sometimes, result.reachability):
        assert found["status"] == REACHED, (prop, goal.name)


# -- the command line ---------------------------------------------------------------------------------------------

def test_check_fails_a_property_that_holds_but_never_draws_a_declared_case(monkeypatch, capsys, tmp_path):
    reg = catalog.load()
    key = ("kv-zeroing", "zeroed_blocks_are_cleared")
    never = Sometimes("a_thousand_blocks", lambda case: len(case.block_ids) >= 1000, "a call of 1,000 blocks")
    monkeypatch.setitem(reg.properties, key, dataclasses.replace(reg.properties[key],
                                                                 sometimes=reg.properties[key].sometimes + (never,)))
    junit = tmp_path / "check.xml"
    argv = ["check", "kv-zeroing", "--property", key[1]]
    assert cli.main([*argv, "--json", "--junit", str(junit)]) == 1
    doc = json.loads(capsys.readouterr().out)
    (result,) = doc["results"]
    assert result["status"] == "passed"
    assert [(g["name"], g["status"]) for g in result["reachability"]][-2:] == [
        ("several_blocks_a_call", REACHED), ("a_thousand_blocks", UNREACHED)]
    xml = junit.read_text()
    assert f'name="{key[1]} sometimes a_thousand_blocks"' in xml and 'type="unreached"' in xml
    assert cli.main(argv) == 1
    text = capsys.readouterr().out
    assert "sometimes: 4 of 5 met by a drawn case" in text
    assert f"UNREACHED sometimes a_thousand_blocks ({key[1]}): no case of 200 drawn satisfies it" in text
    assert f"{key[1]} never draws a_thousand_blocks: a property whose inputs never reach" in text
    # a smaller budget is a bound: shown, and the check passes
    assert cli.main([*argv, "--max-examples", "20"]) == 0
    assert "(a bound, not a failure): a_thousand_blocks (zeroed_blocks_are_cleared)" in capsys.readouterr().out
