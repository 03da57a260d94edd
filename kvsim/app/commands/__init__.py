"""One module per `kvsim` command: its argument table (`arguments`), `run(args)` returning the command's
document, `render(doc)` making its text from that document alone, and `exit_code(doc)`. `kvsim conform` is
`kvsim.conform.cli`'s; the dispatcher (`kvsim.app.cli`) builds the parser from these and prints."""

from __future__ import annotations

from . import check, events, explore, fuzz, list, oracle, replay, repro, report, show, simulate

# the order of `kvsim --help` (conform, `kvsim.conform.cli`, comes after oracle)
BEFORE_CONFORM = (list, check, repro, explore, fuzz, simulate, replay, events, oracle)
AFTER_CONFORM = (show, report)
