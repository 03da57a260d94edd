"""The application on top of the engine: the command line and what it needs.

`cli` (the `kvsim` command), `catalog` (fills the registry from the model and properties packages),
`repro` (bug reports), `simulate` (a seeded run and its trace), `counterexample` (saved counterexamples and
their replay), `oracle` (kernel properties on every backend). It loads models, properties and the oracle
lazily, so `kvsim list`, `explore`, `simulate` and `replay` never import Hypothesis.
"""
