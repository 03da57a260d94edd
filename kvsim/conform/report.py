"""Running targets against a source, and printing results: one release, or the release table."""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

from kvsim.engine.errors import ConfigError, KvsimError

from .loader import names_in
from .releases import bug_rows, format_bug_rows
from .source import EngineSource, resolve_source
from .targets import RunOptions, Target, TargetResult


def run_target(target: Target, source: EngineSource, options: RunOptions) -> TargetResult:
    """Run one target; a file or definition the release lacks is "not present", a load failure "error"."""
    started = time.perf_counter()
    if not source.has(target.relpath):
        return TargetResult(target.name, source.version, "not present",
                            note=f"{target.relpath}: absent in {source.label}").finish(started)
    missing = [s for s in target.symbols if s not in names_in(source.file(target.relpath))]
    if missing:
        return TargetResult(target.name, source.version, "not present",
                            note=f"{target.relpath}:{','.join(missing)}: absent in {source.label}").finish(started)
    try:
        result = target.run(source, options)
    except KvsimError as exc:
        return TargetResult(target.name, source.version, "error", note=str(exc)).finish(started)
    except Exception as exc:  # noqa: BLE001 - upstream's code around the target changed shape in this release
        return TargetResult(target.name, source.version, "error",
                            note=f"{target.relpath}: the adapter could not drive {', '.join(target.symbols)} "
                                 f"in {source.label}: {type(exc).__name__}: {exc}").finish(started)
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def run_all(targets: Sequence[Target], source: EngineSource, options: RunOptions) -> list[TargetResult]:
    return [run_target(t, source, options) for t in targets]


def exit_code(results: Sequence[TargetResult], *, table: bool = False, chosen: bool = False) -> int:
    """2: a target could not be loaded (or the one target asked for is not in the release); 1: a divergence;
    0: all conform. A target of another release's code that is absent from this one ("not present", say
    the uniform MLA plan on vLLM 0.33.0) is information when every target runs, an error when `--target`
    named it."""
    if any(r.status == "error" or (r.status == "not present" and chosen and not table) for r in results):
        return 2
    return 1 if any(r.status == "diverges" for r in results) else 0


def _short(value: Any, width: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


def format_results(source: EngineSource, results: Sequence[TargetResult]) -> str:
    lines = [f"kvsim conform {source.engine}: {source.label} from {source.origin}"]
    for r in results:
        lines.append(f"  {r.target:<34} {r.status:<12} {r.compared:>7} inputs  {r.divergent:>5} divergent  "
                     f"{r.seconds:7.2f} s")
        if r.note:
            lines.append(f"      {r.note}")
        for d in r.divergences:
            lines.append(f"      input {_short(d['input'])}")
            lines.append(f"        model {_short(d['model'])}  upstream {_short(d['upstream'])}")
            if d.get("note"):
                lines.append(f"        {d['note']}")
        for p in r.properties:
            if p["status"] != "holds":
                lines.append(f"      property {p['property']}: {p['status']} {p['message']}")
    return "\n".join(lines)


def release_table(engine: str, versions: Sequence[str], targets: Sequence[Target],
                  options: RunOptions) -> tuple[list[str], dict[str, dict[str, TargetResult]]]:
    table: dict[str, dict[str, TargetResult]] = {t.name: {} for t in targets}
    for version in versions:
        source = resolve_source(engine, version=version)
        for result in run_all(targets, source, options):
            table[result.target][version] = result
    return list(versions), table


def format_table(engine: str, versions: Sequence[str], table: dict[str, dict[str, TargetResult]]) -> str:
    width = max([len(n) for n in table] + [6])
    head = f"{'target':<{width}}  " + "  ".join(f"{engine} {v:<12}" for v in versions)
    lines = [head]
    for name, row in table.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{row[v].status:<{len(engine) + 13}}" for v in versions))
    notes = [f"  {v} {name}: {r.note}" for name, row in table.items() for v, r in row.items() if r.note]
    failing = [f"  {v} {name}: property {p['property']} fails" for name, row in table.items()
               for v, r in row.items() for p in r.properties if p["status"] == "fails"]
    confirmed = [f"  {v} {name}: {p['property']}: {p['message']}" for name, row in table.items()
                 for v, r in row.items() for p in r.properties if p["status"] == "finding confirmed"]
    bugs = format_bug_rows(bug_rows(engine, versions, table), versions)
    return "\n".join(lines + (["notes:"] + notes if notes else [])
                     + (["properties failing on the real code:"] + failing if failing else [])
                     + (["open-upstream findings confirmed on the real code:"] + confirmed if confirmed else [])
                     + bugs)


def parse_versions(text: str) -> list[str]:
    versions = [v.strip() for v in text.split(",") if v.strip()]
    if not versions:
        raise ConfigError("--versions", "a comma-separated list of releases such as 0.27.1,0.28.0", text)
    return versions


def to_json(result: TargetResult) -> dict[str, Any]:
    return json.loads(json.dumps(result.__dict__, default=str))
