"""Strategies, named properties, pinned regressions and bug reports, one package per model.

`kvsim.properties.<model>.register(registry)` adds the model's properties and
bug reports (`kvsim.app.catalog` calls it for every model in
`kvsim.models.MODELS`). Strategies live in each package's `strategies`
module and are imported only when a property runs.
"""
