"""Conformance: a model's behaviour checked against the engine's own code, as one more driver of the engine.

A conform target is data declared next to its model (`ModelDescriptor.conform`, `declare.ConformTarget`): the
upstream files and definitions it loads, the adapter that calls them (`module:attribute`, imported only when
the target runs), and the release -> variant table. The adapter is one of three shapes (`adapters`):

* `Differential`: the model's answer and upstream's on Hypothesis inputs, compared after every call; run by
  the same property runner `kvsim check` uses (`kvsim.engine.runner.run_property`), so a divergence shrinks.
* `Sweep`: the same, over an exhaustive domain in size order (the first divergence is the smallest).
* `Lockstep`: the model and upstream driven by one Hypothesis state machine (`kvsim.engine.stateful`),
  every return value and observation compared after every step; a divergence shrinks to a short program.

`runner.run_target` runs any of them: upstream's calls under a per-call deadline (`deadline`), every raise,
wrong type or hang of the code under test turned into an answer (`answers`) and so into a divergence, the
comparison with field names (`compare`), the model's properties on upstream's answers, the lines of the
checked definitions that ran (`linetrace`, by line probes: `probes`), and the result record
(`result.TargetResult`). Loading the upstream code is the caller's (`kvsim.conform`, the application layer):
the engine knows no engine.
`mutants` makes the mutants `kvsim conform --mutants` runs the targets against.
"""
