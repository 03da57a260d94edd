"""Mutants of the code under test: one small, realistic change at a time (`kvsim conform --mutants`).

Each operator is a regression an engine developer could write:

* `comparison`: a comparison flipped at its boundary or negated (`<` ↔ `<=`, `>` ↔ `>=`, `==` ↔ `!=`,
  `is` ↔ `is not`, `in` ↔ `not in`);
* `constant`: an integer constant one more or one less;
* `bound`: a `range` end or a slice's upper bound one more or one less;
* `division`: floor division made ceiling division and back (`a // b` ↔ `-(-a // b)`, `cdiv(a, b)` ->
  `a // b`, `math.ceil` ↔ `math.floor`); inside a Triton kernel (a `jit`-decorated function), where integer
  division truncates toward zero and `-(-a // b)` is `a // b` again, ceiling division is `(a + b - 1) // b`;
* `boolean`: one clause of an `and` / `or` dropped;
* `arguments`: two adjacent positional arguments of a call swapped;
* `loop`: `while` made `if` (written `for _ in ((0,) if (test) else ())`, so `break` stays legal);
* `assignment`: an augmented assignment made a plain one (`x += y` -> `x = y`).

A mutant is a text edit of the upstream file (`Mutant.apply`), inside one checked definition, that keeps every
other line where it was (so the loader's line map and the coverage of the other lines stay right), and that
compiles. Mutants inside f-strings and in logging calls are not made (they change no behaviour a check can
see). The order is the source order, so a sample (`sample`) is the same in every run.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

OPERATORS = ("comparison", "constant", "bound", "division", "boolean", "arguments", "loop", "assignment")
FLIPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "is not": "is", "is": "is not",
         "not in": "in", "in": "not in"}
OP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
           ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
LOG_CALLS = frozenset({"debug", "info", "warning", "warning_once", "info_once", "error", "exception", "warn"})


@dataclass(frozen=True)
class Mutant:
    file: str  # the upstream file (relative to the engine's tree)
    definition: str
    operator: str
    line: int
    start: int  # offsets into the file's text
    end: int
    original: str
    replacement: str

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}:{self.operator}:{self.original}->{self.replacement}"

    @property
    def label(self) -> str:
        return f"{self.file}:{self.line} {self.definition} {self.operator}: {self.original!r} -> {self.replacement!r}"

    def apply(self, text: str) -> str:
        if text[self.start:self.end] != self.original:
            raise ValueError(f"mutant {self.label} does not match the file")
        return text[: self.start] + self.replacement + text[self.end:]

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "definition": self.definition, "operator": self.operator, "line": self.line,
                "start": self.start, "end": self.end, "original": self.original, "replacement": self.replacement}

    @classmethod
    def from_json(cls, doc: dict) -> "Mutant":
        return cls(**doc)  # type: ignore[arg-type]


class _Offsets:
    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0]
        for i, ch in enumerate(text):
            if ch == "\n":
                self.starts.append(i + 1)

    def at(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets within the line
        begin = self.starts[line - 1]
        raw = self.text[begin: begin + max(col, 0) + 4 * max(col, 0)].encode("utf-8")[:col]
        return begin + len(raw.decode("utf-8", errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)  # type: ignore


def planted(text: str, file: str, after: str, original: str, replacement: str) -> Mutant:
    """A hand-made mutant of `text` (the upstream file `file`): the first `original` after `after`, made
    `replacement` (a test's planted regression)."""
    start = text.index(original, text.index(after))
    return Mutant(file, after, "planted", text.count("\n", 0, start) + 1, start, start + len(original), original,
                  replacement)


def mutants(text: str, file: str, definitions: Sequence[str]) -> list[Mutant]:
    """Every mutant of the named definitions ("fn", "Class", "Class.method") of `text`, in source order."""
    from .linetrace import find_definition

    tree = ast.parse(text)
    offsets = _Offsets(text)
    found: list[Mutant] = []
    for name in definitions:
        node = find_definition(tree, name)
        if node is None:
            continue
        kernel = _is_kernel(node)
        for stmt in _bodies(node):
            found.extend(_in(stmt, name, file, offsets, kernel))
    unique = {(m.start, m.end, m.replacement): m for m in found if m.original != m.replacement
              and m.replacement.count("\n") == m.original.count("\n")}
    return sorted((m for m in unique.values() if _compiles(m.apply(text))),
                  key=lambda m: (m.start, m.end, m.operator, m.replacement))


def _compiles(text: str) -> bool:
    try:
        compile(text, "<mutant>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def sample(all_mutants: Sequence[Mutant], n: int) -> list[Mutant]:
    """`n` mutants spread evenly over the source (the same ones every run): CI's short mutation run."""
    if n >= len(all_mutants):
        return list(all_mutants)
    step = len(all_mutants) / n
    return [all_mutants[int(i * step + step / 2)] for i in range(n)]


def _bodies(node: ast.AST) -> Iterator[ast.stmt]:
    body = getattr(node, "body", [])
    if isinstance(node, ast.ClassDef):
        for child in body:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from _bodies(child)
        return
    for i, stmt in enumerate(body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        yield stmt


def _skipped(stmt: ast.stmt) -> set[int]:
    """ids of nodes no mutant is made in: f-strings, logging calls, annotations."""
    out: set[int] = set()
    for node in ast.walk(stmt):
        subtree = None
        if isinstance(node, ast.JoinedStr):
            subtree = node
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOG_CALLS:
            subtree = node
        elif isinstance(node, (ast.AnnAssign,)) and node.annotation is not None:
            subtree = node.annotation
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                if arg.annotation is not None:
                    out.update(id(n) for n in ast.walk(arg.annotation))
            if node.returns is not None:
                out.update(id(n) for n in ast.walk(node.returns))
            out.update(id(n) for d in node.decorator_list for n in ast.walk(d))
            out.update(id(n) for d in node.args.defaults + node.args.kw_defaults if d is not None
                       for n in ast.walk(d))
        if subtree is not None:
            out.update(id(n) for n in ast.walk(subtree))
    return out


def _is_kernel(node: ast.AST) -> bool:
    """A Triton kernel: a function whose decorator is `jit` (`@triton.jit`, `@jit`, `@triton.jit(...)`)."""
    for d in getattr(node, "decorator_list", ()):
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def _in(stmt: ast.stmt, definition: str, file: str, o: _Offsets, kernel: bool = False) -> Iterator[Mutant]:
    skip = _skipped(stmt)
    text = o.text

    def make(operator: str, node: ast.AST, start: int, end: int, replacement: str) -> Mutant:
        return Mutant(file, definition, operator, node.lineno, start, end, text[start:end], replacement)

    for node in ast.walk(stmt):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            operands = [node.left] + list(node.comparators)
            for i, op in enumerate(node.ops):
                gap_start, gap_end = o.span(operands[i])[1], o.span(operands[i + 1])[0]
                gap = text[gap_start:gap_end]
                word = OP_TEXT[type(op)]
                pattern = r"\s+".join(re.escape(w) for w in word.split())
                pattern = rf"(?<![\w]){pattern}(?![\w])" if word[0].isalpha() else rf"(?<![<>=!]){pattern}(?![=])"
                match = re.search(pattern, gap)
                if match:
                    yield make("comparison", node, gap_start + match.start(), gap_start + match.end(), FLIPS[word])
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            start, end = o.span(node)
            for delta in (1, -1):
                if node.value + delta >= 0:
                    yield make("constant", node, start, end, str(node.value + delta))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("range", "static_range") and node.args:
                stop = node.args[0] if len(node.args) == 1 else node.args[1]
                start, end = o.span(stop)
                for sign in ("+", "-"):
                    yield make("bound", stop, start, end, f"({text[start:end]}) {sign} 1")
            if name.endswith("cdiv") and len(node.args) == 2:
                start, end = o.span(node)
                a, b = (text[slice(*o.span(x))] for x in node.args)
                pad = "\n" * text[start:end].count("\n")
                yield make("division", node, start, end, f"(({a}) // ({b}){pad})")
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("ceil", "floor"):
                start, end = o.span(node.func)
                other = "floor" if node.func.attr == "ceil" else "ceil"
                yield make("division", node, start, end, text[start:end].rsplit(node.func.attr, 1)[0] + other)
            positional = [a for a in node.args if not isinstance(a, ast.Starred)]
            if name not in LOG_CALLS:
                for x, y in zip(positional, positional[1:]):
                    (xs, xe), (ys, ye) = o.span(x), o.span(y)
                    if text[xs:xe] != text[ys:ye]:
                        yield make("arguments", node, xs, ye, text[ys:ye] + text[xe:ys] + text[xs:xe])
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and node.slice.upper is not None:
            start, end = o.span(node.slice.upper)
            for sign in ("+", "-"):
                yield make("bound", node.slice.upper, start, end, f"({text[start:end]}) {sign} 1")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            start, end = o.span(node)
            le, rs = o.span(node.left)[1], o.span(node.right)[0]
            op = text.index("//", le, rs)
            a, b = text[start:op], text[op + 2:end]
            yield make("division", node, start, end, f"((({a}) + ({b}) - 1) // ({b}))" if kernel else
                       f"(-(-({a})//({b})))")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.BinOp) \
                and isinstance(node.operand.op, ast.FloorDiv) and isinstance(node.operand.left, ast.UnaryOp) \
                and isinstance(node.operand.left.op, ast.USub):
            start, end = o.span(node)
            inner = node.operand
            a, b = (text[slice(*o.span(x))] for x in (inner.left.operand, inner.right))
            pad = "\n" * (text[start:end].count("\n") - a.count("\n") - b.count("\n"))
            yield make("division", node, start, end, f"(({a}) // ({b}){pad})")
        elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
            start, end = o.span(node)
            word = " and " if isinstance(node.op, ast.And) else " or "
            texts = [f"({text[slice(*o.span(v))]})" for v in node.values]
            for i in range(len(texts)):
                kept = word.join(t for j, t in enumerate(texts) if j != i)
                pad = "\n" * (text[start:end].count("\n") - kept.count("\n"))
                yield make("boolean", node, start, end, f"({kept}{pad})")
        elif isinstance(node, ast.While):  # as a `for` over at most one turn, so `break` and `continue` stay legal
            start, end = o.at(node.lineno, node.col_offset), o.span(node.test)[1]
            test = text[o.span(node.test)[0]:end]
            yield make("loop", node, start, end, f"for _ in ((0,) if ({test}) else ())")
        elif isinstance(node, ast.AugAssign):
            gap_start, gap_end = o.span(node.target)[1], o.span(node.value)[0]
            gap = text[gap_start:gap_end]
            match = re.search(r"(\*\*|//|>>|<<|[-+*/%&|^@])=", gap)
            if match:
                yield make("assignment", node, gap_start + match.start(), gap_start + match.end(), "=")
