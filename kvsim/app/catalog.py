"""The catalog: every model, property and bug report, loaded on first use.

This is the top of kvsim. `models()` imports each model package for its
`DESCRIPTOR` only (what `explore`, `simulate` and `replay` need); `load()`
also calls each properties package's `register(registry)`, which adds the
model's properties and bug reports. Neither imports Hypothesis: strategies
are imported when a property runs. Built-in models are listed in
`kvsim.models.MODELS` (a package with more than one transition system lists
its descriptors in `DESCRIPTORS`); another installed package adds its own through the
entry-point group `kvsim.models` (a `register(registry)` callable that adds a
descriptor, properties and bug reports).
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from ..engine.registry import REGISTRY, Registry

_state = {"models": False, "properties": False}


def models() -> Registry:
    """The registry with every built-in model's descriptor (no properties, no bug reports)."""
    if not _state["models"]:
        from .. import models as package

        for name in package.MODELS:
            module = importlib.import_module(f"{package.__name__}.{name}")
            for descriptor in getattr(module, "DESCRIPTORS", (module.DESCRIPTOR,)):
                REGISTRY.add_model(descriptor)
        _state["models"] = True
    return REGISTRY


def load() -> Registry:
    """The whole catalog: descriptors, properties and bug reports, built-in and from entry points."""
    models()
    if not _state["properties"]:
        from .. import models as package

        for name in package.MODELS:
            importlib.import_module(f"kvsim.properties.{name}").register(REGISTRY)
        for entry in sorted(metadata.entry_points(group="kvsim.models"), key=lambda e: e.name):
            entry.load()(REGISTRY)
        _state["properties"] = True
    return REGISTRY


def listing() -> dict[str, Any]:
    reg = load()
    models_doc = [{"name": m.name, "summary": m.summary, "source": m.source, "variants": list(m.variants.names),
                   "properties": [p.name for p in reg.properties_of(m.name)],
                   "params": [_param_json(s) for s in m.params],
                   "sim_params": [_param_json(s) for s in m.sim_params],
                   "explore": m.system is not None, "simulate": m.simulate is not None,
                   "sometimes": _sometimes(m) + _drawn_sometimes(reg.properties_of(m.name))}
                  for m in reg.models.values()]
    bugs = [{"id": b.id, "model": b.model, "variant": b.variant, "property": b.property, "invariant": b.invariant,
             "check": b.check, "source": b.source, "summary": b.summary, "status": b.status, "note": b.note,
             "verdicts": [v.to_json() for v in b.verdicts]}
            for b in reg.bugs.values()]
    return {"models": models_doc, "bugs": bugs}


def _sometimes(model: Any) -> list[dict[str, Any]]:
    """The reachability declarations of the model's transition system at its defaults (`kvsim explore`
    reports each reached or not): name, whether it is asked of states or of steps, and what it means."""
    if model.system is None:
        return []
    from kvsim.engine.descriptor import RunSpec
    from kvsim.engine.system import sometimes

    system = RunSpec.resolve(model, "fixed" if "fixed" in model.variants.names else model.variants.names[0]).system()
    return [{"name": s.name, "of": "step" if s.step else "state", "doc": s.doc} for s in sometimes(system)]


def _drawn_sometimes(properties: list[Any]) -> list[dict[str, Any]]:
    """The data properties' reachability declarations (`kvsim check` reports each met by a drawn case or not):
    one row a name, with the properties that declare it, in the order first declared."""
    rows: dict[str, dict[str, Any]] = {}
    for prop in properties:
        for goal in prop.sometimes:
            row = rows.setdefault(goal.name, {"name": goal.name, "of": "case", "doc": goal.doc, "properties": []})
            row["properties"].append(prop.name)
    return list(rows.values())


def _param_json(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "type": spec.kind, "default": spec.default, "minimum": spec.minimum,
            "maximum": spec.maximum, "choices": list(spec.choices), "doc": spec.doc}
