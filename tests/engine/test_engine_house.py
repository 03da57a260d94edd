"""The house pieces of the engine: variant records, tagged records, parameters from config fields, descriptors,
the Driver, and the effects channel."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvsim.engine.actions import decode, tagged, type_table
from kvsim.engine.canon import canonical_json, to_jsonable
from kvsim.engine.descriptor import ModelDescriptor, RunSpec
from kvsim.engine.errors import ConfigError
from kvsim.engine.params import config_from, param, params_of, resolve
from kvsim.engine.sim import Driver
from kvsim.engine.system import run_actions, transition
from kvsim.engine.variants import Variant, VariantTable
from toys import Counter


@dataclass(frozen=True)
class V(Variant):
    new_rule: bool


TABLE = VariantTable(V("fixed", True), V("pre_x", False))


def test_variant_table_resolves_names_once_and_refuses_the_rest():
    assert TABLE.fixed is TABLE["fixed"] and TABLE["pre_x"].new_rule is False
    assert TABLE.resolve(TABLE["pre_x"]) is TABLE["pre_x"]
    assert TABLE.names == ("fixed", "pre_x")
    for bad in ("fixd", "", V("fixed", False)):  # a record not of this table is refused too
        with pytest.raises(ConfigError, match="^variant: expected one of fixed, pre_x"):
            TABLE.resolve(bad)
    assert to_jsonable({"v": TABLE["pre_x"]}) == {"v": "pre_x"}
    with pytest.raises(ValueError, match="starts with the `fixed`"):
        VariantTable(V("pre_x", False))


Deliver = tagged("deliver", "writer", "message")
Req = tagged("REQ", "room", "chunk")
TYPES = type_table((Deliver, Req))


def test_tagged_records_are_their_tuples_and_round_trip():
    action = Deliver(1, Req(room=4, chunk=0))
    assert action == ("deliver", 1, ("REQ", 4, 0)) and hash(action) == hash(("deliver", 1, ("REQ", 4, 0)))
    assert action.writer == 1 and action.message.room == 4
    assert to_jsonable(action) == ["deliver", 1, ["REQ", 4, 0]]  # the JSON form of the plain tuple
    back = decode(to_jsonable(action), TYPES)
    assert back == action and type(back) is Deliver and type(back.message) is Req
    assert repr(action) == "deliver(writer=1, message=REQ(room=4, chunk=0))"
    assert action._replace(writer=2) == ("deliver", 2, ("REQ", 4, 0))
    with pytest.raises(TypeError, match="missing field 'chunk'"):
        Req(4)


def test_a_record_type_builds_from_positions_and_names_and_names_a_wrong_field():
    """A record type's own constructor (its fields as parameters): any mix of positions and names gives the
    same record, and a missing, extra or unknown field is named as `Tagged.__new__` names it."""
    assert Req(4, 0) == Req(room=4, chunk=0) == Req(4, chunk=0) == Req(chunk=0, room=4) == ("REQ", 4, 0)
    assert type(Req(chunk=0, room=4)) is Req
    with pytest.raises(TypeError, match="missing field 'room'"):
        Req(chunk=0)
    with pytest.raises(TypeError, match=r"Req takes 2 fields \('room', 'chunk'\), got 3"):
        Req(4, 0, 1)
    with pytest.raises(TypeError, match=r"Req: unknown fields \['page'\]"):
        Req(4, 0, page=1)
    odd = tagged("odd", "from", "_x")  # names no parameter can carry: the general constructor
    assert odd(1, 2) == ("odd", 1, 2) and odd(1, 2)._x == 2
    empty = tagged("peer_death")
    assert empty() == ("peer_death",)
    with pytest.raises(TypeError, match="takes 0 fields"):
        empty(1)


def test_a_record_types_positional_new_is_its_constructor():
    """`T._new(*fields)` (a hot path's constructor, no class call) gives the record `T(*fields)` gives: the same
    type, tuple and repr, for fields as parameters, no field, and names no parameter can carry."""
    odd = tagged("odd", "from", "_x")
    for t, fields in ((Req, (4, 0)), (Deliver, (1, Req(4, 0))), (tagged("peer_death"), ()), (odd, (1, 2))):
        made = t._new(*fields)
        assert type(made) is t and made == t(*fields) and repr(made) == repr(t(*fields)) and made[0] == t.tag
    with pytest.raises(TypeError):
        Req._new(4)


@dataclass(frozen=True)
class Config:
    rooms: int = param(1, "rooms", minimum=1, maximum=3)
    sizes: tuple[int, ...] = param((1, 2), "sizes", minimum=1, maximum=9)
    rate: float = param(0.5, "rate", minimum=0.0)
    staging: bool = param(False, "staging on")
    backend: str = param("a", "backend", choices=("a", "b"))
    derived: int = 0  # not a parameter


def test_params_come_from_the_config_fields():
    specs = params_of(Config)
    assert [(s.name, s.kind, s.default) for s in specs] == [
        ("rooms", "int", 1), ("sizes", "ints", (1, 2)), ("rate", "float", 0.5), ("staging", "int", 0),
        ("backend", "str", "a")]
    values = resolve(specs, ["rooms=3", "staging=1", "backend=b"])
    config = config_from(Config, values)
    assert config == Config(rooms=3, staging=True, backend="b") and config.staging is True
    with pytest.raises(ConfigError, match=r"^param rooms: expected an integer \(>= 1 and <= 3\), got 4"):
        resolve(specs, ["rooms=4"])


def counter_system(variant, config):
    return Counter(limit=config.rooms + 7)


def test_descriptor_builds_systems_from_names_and_values():
    model = ModelDescriptor(name="toy-counter", summary="s", source="t", variants=TABLE, config=Config,
                            system=counter_system)
    assert [s.name for s in model.params][:2] == ["rooms", "sizes"]
    assert model.build_system("pre_x", {"rooms": 2}).limit == 9
    run = RunSpec.resolve(model, "pre_x", ["rooms=3"])
    assert run.variant is TABLE["pre_x"] and run.given == {"rooms": 3} and run.params["rate"] == 0.5
    assert run.system().limit == 10
    with pytest.raises(ConfigError, match="^variant"):
        RunSpec.resolve(model, "nope")
    with pytest.raises(ValueError, match="config dataclass"):
        ModelDescriptor(name="x", summary="s", source="t", variants=TABLE, system=counter_system)


def test_driver_keeps_the_state_and_the_actions_that_replay_to_it():
    system = Counter(limit=10, bad=None)
    driver = Driver(system)
    for _ in range(4):
        assert driver.apply(driver.enabled()[-1]) == ()  # Counter has no transition(): no effects
    assert driver.state == 8 and canonical_json(driver.actions) == '[["inc"],["double"],["double"],["double"]]'
    assert run_actions(system, driver.actions)[-1] == driver.state


def test_transition_prefers_the_systems_own_effects():
    class WithEffects(Counter):
        def transition(self, state, action):
            after = self.step(state, action)
            return after, (("moved", after - state),)

    assert transition(WithEffects(), 3, ("inc",)) == (4, (("moved", 1),))
    assert transition(Counter(), 3, ("double",)) == (6, ())
