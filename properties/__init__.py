"""Strategies, named properties, pinned regressions and bug reports, one package per model.

`kvsim.properties.<model>.register(registry)` adds the model's properties and
bug reports (`kvsim.app.catalog` calls it for every model in
`kvsim.models.MODELS`); the bug reports are data, `<model>/bugs.toml`, read and
checked by `kvsim.engine.bugfile`. Strategies live in each package's `strategies`
module and are imported only when a property runs.
"""
