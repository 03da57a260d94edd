"""The engine: everything that knows no KV cache.

Contracts (`system`: the transition system; `descriptor`, `variants`, `params`: what a model declares;
`actions`: tagged records), the three drivers over one system (`explore`, `stateful`, `sim`), traces and
canonical JSON (`trace`, `canon`), and the check engine (`property`, `registry`, `runner`). Nothing here
imports a model, a property, the oracle or the application (`tests/test_house.py`).
"""
