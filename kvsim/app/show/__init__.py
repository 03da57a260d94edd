"""`kvsim show`: a counterexample drawn.

A path of a transition system (an explored violation, a stateful property's failing program, the
actions of a simulation trace) becomes a message sequence chart (`chart.SequenceChart`): one lifeline
per actor, one arrow per message or call, faults marked, and the violated invariant at the step where
it first fails. Who the actors are is each model's knowledge: the optional chart hook
`kvsim.models.<model>.chart` (`lifelines(system)`, `arrows(system, state, action)`); a model without
one gets one lifeline per action kind. A data property's shrunk input becomes a table
(`chart.CaseTable`). `sources` gets the counterexample (by reproducing a catalogued bug, once per
process, or from a saved file), `text` prints it, `draw` writes SVG or PNG with matplotlib.
"""
