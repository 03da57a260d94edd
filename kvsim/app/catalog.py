"""The catalog: every model, property and bug report, loaded on first use.

This is the top of kvsim: it imports the `properties` package (which imports
the models and registers them). Core modules never import it.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..engine.registry import REGISTRY, Registry

_loaded = False


def load() -> Registry:
    global _loaded
    if not _loaded:
        importlib.import_module("kvsim.properties")
        _loaded = True
    return REGISTRY


def listing() -> dict[str, Any]:
    reg = load()
    models = [{"name": m.name, "summary": m.summary, "source": m.source, "variants": list(m.variants),
               "properties": [p.name for p in reg.properties_of(m.name)],
               "explore": m.system is not None, "simulate": m.simulate is not None}
              for m in reg.models.values()]
    bugs = [{"id": b.id, "model": b.model, "variant": b.variant, "property": b.property, "source": b.source,
             "summary": b.summary, "status": b.status, "note": b.note} for b in reg.bugs.values()]
    return {"models": models, "bugs": bugs}
