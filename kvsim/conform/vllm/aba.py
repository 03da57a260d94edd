"""The A→B→A hybrid prefix-cache family (vLLM #50630, #53912, #49502) at the KV-manager level: programs of requests
A, B, A' with shared and different prefixes, run on a release's own hybrid coordinator in its child
(`real_coordinator.CoordinatorDriver`), checked per group with `checks.hit_state_identity`: the block a hit reuses
holds the state for exactly that prefix.

The child answers which block sits at which position of every group's table after each step; the parent keeps the
ledger of what the model runner wrote there (`model_runner.step_writes`: KV per token position, the Mamba state of
mode `align` in the running column `cdiv(end, block_size) - 1`). Every hit is checked against it: each admission's
reconciled hit (what the request then reuses), and each lookup's reconciled hit, connector hit and every group's own
hit (`find_longest_cache_hit_per_group`, the path the scheduler's connector branch and the Mooncake copies read).

A program is a list of operations, run in order by `run`:

* `("admit", name, tokens, chunk)`: `computed` then `allocate` of the tokens after the hit in steps of at most
  `chunk` tokens (chunked prefill; a chunk may end inside a block, as the write-side reports' fragmented cold
  prefills do), each step's writes entered in the ledger;
* `("step", name, n)`: one more prefill step of at most `n` tokens of an admitted request (so two requests'
  prefills interleave: concurrent cold prefills);
* `("decode", name, token)`: the sampled token appended and computed in one step;
* `("free", name)`; `("lookup", tokens)`: the lookups a scheduler makes for a new request with `tokens`.

`programs(seed)` draws them from the family's shape: a prefix P, A = P + X, B = P[:k] + Y (k inside or at the end
of a block, or 0), A' = A's prompt, or A's prompt with its decoded tokens, or A's prompt extended; B before A'
finishes, interleaved with A, or with A'; a pool tight enough that B evicts A's blocks, or roomy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from kvsim.models.kv_cache_manager import checks
from kvsim.models.kv_cache_manager.model_runner import step_writes

DRIVER = "kvsim.conform.vllm.real_coordinator:CoordinatorDriver"
BLOCK_SIZE, WINDOW = 2, 3
GROUPS = (("full", "mamba"), ("full", "swa"), ("full", "swa", "mamba"))


@dataclass
class Ledger:
    """The parent's side of a run: the runner's writes (block id -> kind, tokens) and each request's progress."""

    kinds: tuple[str, ...]
    use_eagle: bool = False
    aligned: bool = True  # prefill chunks clipped as the scheduler clips them (`aligned_split`), else as drawn
    written: dict[int, tuple] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    hits: int = 0  # hits of at least one block checked
    parted: int = 0  # lookups where a group's own hit is deeper than full attention's (0.26.0's scheduler takes the max)
    steps: int = 0

    def step(self, name: str, tables: Sequence[Sequence[int]], start: int, end: int) -> None:
        self.written.update(step_writes(self.kinds, tables, self.tokens[name], start, end, BLOCK_SIZE))
        self.computed[name] = end
        self.steps += 1

    def check(self, blocks: Sequence[Sequence[int]], tokens: Sequence[int], hit: int, what: str,
              kinds: Sequence[str] | None = None) -> None:
        self.hits += hit >= BLOCK_SIZE
        problem = checks.hit_state_identity(kinds or self.kinds, blocks, self.written, tokens, hit, BLOCK_SIZE,
                                            WINDOW, what)
        if problem is not None:
            self.problems.append(problem)


def aligned_split(start: int, budget: int, num_tokens: int, use_eagle: bool) -> int:
    """The tokens a prefill step of at most `budget` computes from `start`, as the scheduler of 0.33.0 clips a chunk
    for a Mamba group in mode `align` (`Scheduler._mamba_block_aligned_split`, without fine-grained hits, junctions
    or internal checkpoints): a chunk ends on a block boundary unless it ends the prompt (or the budget cannot
    reach the next boundary, the block wider than a chunk), a chunk starting inside a block stops at the block's
    end, and none runs past the last cacheable boundary (one block lower with EAGLE)."""
    end = min(start + budget, num_tokens)
    if end < num_tokens and end // BLOCK_SIZE * BLOCK_SIZE > start:
        end = end // BLOCK_SIZE * BLOCK_SIZE
    last_cache_position = num_tokens // BLOCK_SIZE * BLOCK_SIZE
    if use_eagle:
        last_cache_position = max(last_cache_position - BLOCK_SIZE, 0)
    stops = [(start // BLOCK_SIZE + 1) * BLOCK_SIZE if start % BLOCK_SIZE else 0, last_cache_position]
    return min([end] + [s for s in stops if start < s < end]) - start


def _allocate(child: Any, ledger: Ledger, name: str, budget: int, hit: int = 0) -> bool:
    start = ledger.computed[name] + hit
    n = aligned_split(start, budget, len(ledger.tokens[name]), ledger.use_eagle) if ledger.aligned else \
        min(budget, len(ledger.tokens[name]) - start)
    answer = child.call("allocate", request=name, new_tokens=n, computed_tokens=hit)
    if answer["blocks"] is None:
        return False
    ledger.step(name, answer["held"], start, start + n)
    return True


def run(child: Any, kinds: Sequence[str], num_blocks: int, program: Sequence[tuple], use_eagle: bool = False,
        aligned: bool = True) -> Ledger:
    """The program on a fresh manager in `child`; the ledger with every problem `hit_state_identity` found.
    `aligned=False` hands the manager the chunks as drawn (a scheduler that does not clip them)."""
    ledger = Ledger(tuple(kinds), use_eagle, aligned)
    child.call("build_hybrid", num_blocks=num_blocks, block_size=BLOCK_SIZE, groups=list(kinds),
               sliding_window=WINDOW, use_eagle=use_eagle, mamba_cache_mode="align" if "mamba" in kinds else None)
    lookups = 0
    for op in program:
        kind, name = op[0], op[1]
        if kind == "admit":
            tokens, chunk = list(op[2]), op[3]
            ledger.tokens[name], ledger.computed[name] = tokens, 0
            hit = child.call("computed", request=name, tokens=tokens)
            ledger.check(hit["blocks"], tokens, hit["hit"], f"{name}'s hit")
            if not _allocate(child, ledger, name, chunk, hit["hit"]):
                child.call("free", request=name)  # refused: the request waits, holding nothing
                ledger.tokens.pop(name)
        elif kind == "step" and name in ledger.tokens and 0 <= ledger.computed[name] < len(ledger.tokens[name]):
            _allocate(child, ledger, name, op[2])
        elif kind == "decode" and name in ledger.tokens and ledger.computed[name] == len(ledger.tokens[name]):
            ledger.tokens[name].append(op[2])
            answer = child.call("decode", request=name, token=op[2])
            if answer["blocks"] is not None:
                ledger.step(name, answer["held"], ledger.computed[name], ledger.computed[name] + 1)
            else:
                ledger.tokens[name].pop()  # no slot: the driver's request keeps the token; stop decoding it
                ledger.computed[name] = -1
        elif kind == "free" and name in ledger.tokens:
            child.call("free", request=name)
            ledger.tokens.pop(name)
        elif kind == "lookup":
            tokens = list(op[1])
            lookups += 1
            hits = child.call("hits", request=f"lookup-{lookups}", tokens=tokens)
            ledger.check(hits["reconciled"]["blocks"], tokens, hits["reconciled"]["hit"], "reconciled hit")
            if hits["connector"] is not None:  # 0.27.0+, the manager's; before it the scheduler's (connector_hit_48195)
                # the connector's local hit is full attention's (group 0): a lagging group's state is the connector's
                ledger.check(hits["connector"]["blocks"][:1], tokens, hits["connector"]["hit"], "connector hit",
                             ["full"])
            if hits["per_group"] is not None:
                ledger.parted += any(h > hits["per_group"]["hits"][0] for h in hits["per_group"]["hits"][1:])
                for g, g_kind in enumerate(kinds):
                    ledger.check([hits["per_group"]["blocks"][g]], tokens, hits["per_group"]["hits"][g],
                                 f"group {g}'s own hit", kinds=[g_kind])
    return ledger


def family(rng: random.Random) -> tuple[list[int], list[int]]:
    """A and B: a shared prefix of 1-3 blocks, A's suffix, and B sharing k tokens of it (inside a block, at a
    block's end, or none)."""
    prefix = [1] * rng.randint(1, 3) * BLOCK_SIZE
    a = prefix + [2] * rng.randint(1, 2 * BLOCK_SIZE + 1)
    k = rng.choice([0, len(prefix) - 1, len(prefix), len(prefix) + 1])
    b = a[:k] + [3] * rng.randint(1, 2 * BLOCK_SIZE + 1)
    return a, b


def prefill(name: str, tokens: list[int], budget: int) -> list[tuple]:
    """A request's prefill: one `admit`, then enough `step`s of at most `budget` tokens."""
    return [("admit", name, tokens, budget)] + [("step", name, budget)] * len(tokens)


def admit(name: str, tokens: list[int], rng: random.Random) -> list[tuple]:
    """A prefill with a drawn budget: a block, a block and one, one token or the whole prompt."""
    return prefill(name, tokens, rng.choice([1, BLOCK_SIZE, BLOCK_SIZE + 1, len(tokens)]))


# the minimal sequence: B shares A's first two blocks, then parts; A' is A's prompt again, looked up first
A_PROMPT, B_PROMPT = [1, 1, 2, 2, 2], [1, 1, 2, 2, 3, 3]
AA = prefill("a", A_PROMPT, 8) + [("free", "a"), ("lookup", A_PROMPT)] + prefill("a2", A_PROMPT, 8)
ABA = prefill("a", A_PROMPT, 8) + [("free", "a")] + prefill("b", B_PROMPT, 8) + [("free", "b"), ("lookup", A_PROMPT)] \
    + prefill("a2", A_PROMPT, 8)


def interleaved(first: list[tuple], second: list[tuple]) -> list[tuple]:
    ops: list[tuple] = []
    for i in range(max(len(first), len(second))):
        ops += first[i:i + 1] + second[i:i + 1]
    return ops


def program(seed: int) -> tuple[tuple[str, ...], int, bool, list[tuple]]:
    """One derandomized A→B→A program: (groups, pool size, use_eagle, operations)."""
    rng = random.Random(seed)
    kinds = GROUPS[seed % len(GROUPS)]
    use_eagle = bool(rng.getrandbits(1))
    a, b = family(rng)
    decodes = [("decode", "a", 4 + i) for i in range(rng.randint(0, 3))]
    b_decodes = [("decode", "b", 6 + i) for i in range(rng.randint(0, 2))]
    shape = rng.choice(["sequential", "concurrent", "b-with-a2"])
    a_ops, b_ops = admit("a", a, rng) + decodes, admit("b", b, rng) + b_decodes
    a_full = a + [4 + i for i in range(len(decodes))]
    again = rng.choice([a, a_full, a_full + [5, 5, 5]])
    a2_ops = admit("a2", list(again), rng) + [("decode", "a2", 8)]
    if shape == "sequential":
        ops = a_ops + [("free", "a")] + b_ops + [("free", "b"), ("lookup", again)] + a2_ops
    elif shape == "concurrent":
        ops = interleaved(a_ops, b_ops) + [("free", "a"), ("free", "b"), ("lookup", again)] + a2_ops
    else:
        ops = a_ops + [("free", "a"), ("lookup", again)] + interleaved(b_ops, a2_ops) + [("free", "b")]
    ops += [("free", "a2"), ("lookup", again)]
    need = len(kinds) * -(-(max(len(a_full), len(b)) + 4) // BLOCK_SIZE)
    num_blocks = rng.choice([need + 1, 2 * need + 2, 3 * need + 3])  # B evicts A's blocks, or does not
    return kinds, num_blocks, use_eagle, ops
