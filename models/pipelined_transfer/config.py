"""Configuration and KV data of the pipelined-transfer transition system.

The `param()` fields are `kvsim explore pipelined-transfer --param`; the
bounds are what explore finishes. Part 3 of the research note asks for three
parameters: the chunk-boundary revision (`boundary`), whether a cancelled
request still emits its final chunk (`cancel_final`, the older revision) and
whether writes to one (request, peer) are FIFO (`fifo`). The `drop` fault
loses a message: a result frame, a CANCEL_SESSION or a cancel-ACK. `rx_pages` sizes
the receiver's page pool: smaller than every request's pages at once, the
requests post one by one and a released page is reallocated (S1 across reuse).

KV data is tracked as fill levels: a source block's content is the number of
its tokens computed when a write snapshots it (a write reads its source at
dispatch); a destination cell per (sender rank, block) holds the fill level
of the last write applied, 0 when never written. A block is fresh when it
holds its full token count (S5).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.engine.errors import ConfigError
from kvsim.engine.params import param

from .chunks import (BOUNDARIES, Group, Slice, cdiv, chunk_slices, is_pipelined_group, prefill_chunks,
                     swa_window_blocks)

FAULT_KINDS = ("fail", "drop", "dup", "silent", "cancel", "shutdown", "gen_cancel")
DEFAULT_FAULTS = "fail,silent,cancel"
GOALS = ("settle", "release")
MAX_CHUNKS = 4
# the most destination cells a state holds (a request's, `ranks` x `cells_per_rank`, each with its pages): a
# simulated workload's parameters go to 5,000 requests of 131,072 blocks on 8 ranks, 5 G cells, which built for
# minutes and took gigabytes before its first event; 4 M cells hold about 150 MB
MAX_CELLS = 1 << 22


def parse_faults(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip() and k.strip() != "none")
    for k in kinds:
        if k not in FAULT_KINDS:
            raise ConfigError("param faults", f"a comma-separated subset of {', '.join(FAULT_KINDS)}", text)
    return kinds


@dataclass(frozen=True)
class PipelinedConfig:
    requests: int = param(1, "requests (each its own sessions on every rank)", minimum=1, maximum=2)
    ranks: int = param(1, "sender TP writer ranks = the receiver's expected_transfers", minimum=1, maximum=4)
    prompt_len: int = param(6, "prompt tokens", minimum=1, maximum=64)
    tokens_per_block: int = param(2, "tokens per KV block (tpb)", minimum=1, maximum=16)
    chunk_tokens: int = param(3, "prefill chunk size in tokens", minimum=1, maximum=64)
    prefix_hit: int = param(0, "prepopulated_prompt_len: the context side's reuse hit (tokens)", minimum=0,
                            maximum=63)
    rx_cached_blocks: int = param(0, "receiver-cached prefix blocks (masked with -1)", minimum=0, maximum=32)
    swa_window: int = param(0, "a second layer group with this sliding window in tokens (0: none); not pipelined "
                               "when shorter than the prompt", minimum=0, maximum=64)
    full_attention: bool = param(True, "a full-attention layer group; 0 (with swa_window): the window group is the "
                                       "request's only one, as in an all-sliding-window model")
    boundary: str = param("A", "chunk-boundary revision: A floors a non-final end, B rounds it up",
                          choices=BOUNDARIES)
    prefix_sent: bool = param(False, "revision B's early-reuse flag: slice 0 starts at its own block")
    fifo: bool = param(True, "writes to one (request, peer) complete in order")
    cancel_final: bool = param(False, "a cancelled request still computes and sends its final chunk (older revision)")
    promotion: bool = param(False, "start in DISAGG_CONTEXT_WAIT_SCHEDULER: peer info per rank, then the "
                                   "promotion consensus")
    timeouts: bool = param(True, "the kv_transfer_timeout_ms clock may pass (and the stall report at 2x)")
    faults: str = param(DEFAULT_FAULTS, f"fault actions, a comma-separated subset of {', '.join(FAULT_KINDS)}")
    fault_budget: int = param(1, "faults per path", minimum=0, maximum=3)
    rx_pages: int = param(0, "the receiver's page pool (0: a set of pages per request, none shared); fewer makes a "
                              "request wait in DISAGG_GENERATION_INIT until a release frees pages, which it then "
                              "reallocates", minimum=0, maximum=64)
    goal: str = param("settle", "liveness goal: settle (release or a reported stall, E4) or release (E3)",
                      choices=GOALS)
    max_chunks: int = MAX_CHUNKS  # not a --param: the timed simulation builds longer prompts

    def __post_init__(self) -> None:
        if self.prefix_hit >= self.prompt_len:
            raise ConfigError("param prefix_hit", f"< prompt_len ({self.prompt_len})", self.prefix_hit)
        if self.rx_cached_blocks >= self.blocks:
            raise ConfigError("param rx_cached_blocks", f"< the prompt's blocks ({self.blocks})",
                              self.rx_cached_blocks)
        n = len(prefill_chunks(self.prompt_len, self.prefix_hit, self.chunk_tokens))
        if n > self.max_chunks:
            raise ConfigError("param chunk_tokens", f"at most {self.max_chunks} prefill chunks", f"{n} chunks")
        if self.prefix_sent and self.boundary != "B":
            raise ConfigError("param prefix_sent", "0 unless boundary=B (an option of revision B)", 1)
        if not self.full_attention and not self.swa_window:
            raise ConfigError("param full_attention", "1 unless swa_window > 0 (a request needs a layer group)", 0)
        parse_faults(self.faults)
        cells = self.ranks * self.cells_per_rank
        if self.requests * cells > MAX_CELLS:
            raise ConfigError("param requests", f"at most {MAX_CELLS // cells} requests of {cells} destination "
                              f"cells ({self.ranks} ranks x {self.cells_per_rank}: a state holds at most "
                              f"{MAX_CELLS} cells)", self.requests)
        if self.rx_pages and not self.cells_per_rank <= self.rx_pages:
            raise ConfigError("param rx_pages", f"0 or at least the pages of one request ({self.cells_per_rank})",
                              self.rx_pages)

    @property
    def pool_size(self) -> int:
        """The receiver's page pool: `rx_pages`, or one set of pages per request."""
        return self.rx_pages or self.requests * self.cells_per_rank

    @property
    def shared_pool(self) -> bool:
        """The pool cannot hold every request at once: requests post (allocate) one by one and reuse pages."""
        return self.pool_size < self.requests * self.cells_per_rank

    @property
    def blocks(self) -> int:
        return cdiv(self.prompt_len, self.tokens_per_block)

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        return parse_faults(self.faults)

    def chunks(self) -> tuple[tuple[int, int], ...]:
        return prefill_chunks(self.prompt_len, self.prefix_hit, self.chunk_tokens)

    def slices(self) -> tuple[Slice | None, ...]:
        """Per prefill chunk, the slice its forward step emits (None: a non-final chunk that emits none)."""
        return chunk_slices(self.chunks(), self.prompt_len, self.tokens_per_block, self.groups(), self.prefix_hit,
                            self.rx_cached_blocks, self.boundary, self.prefix_sent)

    def full(self, block: int) -> int:
        """The token count of a fully computed block."""
        return min(self.tokens_per_block, self.prompt_len - block * self.tokens_per_block)

    def fill(self, block: int, computed_chunks: int) -> int:
        """Tokens of `block` computed after `computed_chunks` forward steps (the reused prefix is there)."""
        chunks = self.chunks()
        end = chunks[computed_chunks - 1][1] if computed_chunks else self.prefix_hit
        return max(0, min(self.full(block), end - block * self.tokens_per_block))

    def groups(self) -> tuple[Group, ...]:
        """The receiver's layer groups (destination id = block index): full attention (unless `full_attention` is
        0), and the window group."""
        whole = tuple(range(self.blocks))
        full = (Group(whole, self.blocks),) if self.full_attention else ()
        return full + ((Group(whole, self.blocks, self.swa_window),) if self.swa_window else ())

    @property
    def cells_per_rank(self) -> int:
        """Destination cells of one writer rank: `group * blocks + block`."""
        return len(self.groups()) * self.blocks

    def expected(self, cell: int) -> int:
        """What a destination cell holds once the transfer is complete: a window group outside its final window
        is never sent (0), everything else the fully computed block (or the receiver's cached copy)."""
        g, b = divmod(cell, self.blocks)
        group = self.groups()[g]
        if (b < self.rx_cached_blocks or is_pipelined_group(self.prompt_len, group.sliding_window)
                or b in swa_window_blocks(self.prompt_len, self.tokens_per_block, group.sliding_window)):
            return self.full(b)
        return 0

    def initial_dest(self) -> tuple[int, ...]:
        """Destination cells [rank * cells_per_rank + cell]: the receiver's cached prefix already holds the KV."""
        return tuple(self.full(u % self.blocks) if u % self.blocks < self.rx_cached_blocks else 0
                     for _ in range(self.ranks) for u in range(self.cells_per_rank))
