"""Running targets against a source, and printing results: one release, or the release table."""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.engine.canon import canonical_json
from kvsim.engine.errors import ConfigError

from .releases import bug_rows, format_bug_rows
from .source import EngineSource, resolve_source
from .targets import Options, TargetResult, run_target  # noqa: F401 - run_target re-exported

WIDTH = 160


def run_all(targets: Sequence[Any], source: EngineSource, options: Options, *, workers: int = 1,
            measure: bool = False) -> list[TargetResult]:
    """Every target on `source`, the results in the targets' order (`workers` > 1: on worker processes)."""
    from .run import run_targets
    from .targets import descriptors

    return run_targets(targets, source, descriptors(), options, measure=measure, workers=workers)


def exit_code(results: Sequence[TargetResult], *, table: bool = False, chosen: bool = False) -> int:
    """2: a target could not be used (or a target asked for by name is not in the release; this comes first, as
    a target that cannot run hides what it would find); 1: a divergence;
    3: the run's budget or an interrupt stopped it before every target ran, with no divergence; 0: all conform.
    A target of another release's code that is absent from this one ("not present", say the uniform MLA plan
    on vLLM 0.33.0) is information when every target runs, an error when `--target` named it."""
    if any(r.status == "error" or (r.status == "not present" and chosen and not table) for r in results):
        return 2
    if any(r.status == "diverges" for r in results):
        return 1
    return 3 if any(r.status in ("incomplete", "not run") for r in results) else 0


def _short(value: Any, width: int = WIDTH) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= width else f"{text[: width - 20]}... ({len(text)} chars)"


def divergence_lines(d: dict[str, Any], subject: str = "upstream", indent: str = "      ") -> list[str]:
    """A divergence as it reads: the (shrunk) input or call program, the first field that differs, both answers."""
    lines = []
    if d.get("program"):
        lines.append(f"{indent}program: " + "; ".join(d["program"]))
    else:
        lines.append(f"{indent}input {_short(d['input'])}")
    if d.get("difference"):
        lines.append(f"{indent}  first difference: " + d["difference"].replace(", upstream ", f", {subject} ", 1))
    lines.append(f"{indent}  model {_short(d['model'])}")
    lines.append(f"{indent}  {subject} {_short(d['upstream'])}")
    if d.get("note"):
        lines.append(f"{indent}  {d['note']}")
    return lines


def format_results(source: EngineSource, results: Sequence[TargetResult]) -> str:
    lines = [f"kvsim conform {source.engine}: {source.label} from {source.origin}"]
    for r in results:
        lines.append(f"  {r.target:<40} {r.status:<12} {r.compared:>7} compared  {r.seconds:7.2f} s")
        if r.note:
            lines.append(f"      {r.note}")
        for d in r.divergences:
            lines.extend(divergence_lines(d, r.subject))
        for p in r.properties:
            if p["status"] != "holds":
                lines.append(f"      property {p['property']}: {p['status']} {p['message']}")
                if p.get("input") is not None:
                    lines.append(f"        input {_short(p['input'])}")
        if r.coverage is not None:
            missed = "; ".join(f"{d} lines {_ranges(ls)}" for f in r.coverage["files"].values()
                               for d, ls in f["missed"].items())
            documented = sum(len(ls) for f in r.coverage["files"].values() for ls in f.get("documented", {}).values())
            lines.append(f"      coverage {r.coverage['percent']}% of {r.coverage['lines']} lines of the checked "
                         f"definitions" + (f" (not run: {missed})" if missed else "")
                         + (f"; {documented} lines no input reaches, documented in the target" if documented else ""))
        if r.logged and r.status not in ("conforms", "not present", "skipped"):
            lines.append("      the code under test logged: " + " | ".join(r.logged[:6]))
    return "\n".join(lines)


def _ranges(lines: Sequence[int]) -> str:
    out: list[str] = []
    for n in lines:
        if out and "-" not in out[-1] and int(out[-1]) == n - 1 or out and "-" in out[-1] and int(
                out[-1].split("-")[1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def release_table(engine: str, versions: Sequence[str], targets: Sequence[Any],
                  options: Options) -> tuple[list[str], dict[str, dict[str, TargetResult]]]:
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
    diverging = [f"  {v} {name}:\n" + "\n".join(divergence_lines(d, r.subject, "      ")) for name, row in table.items()
                 for v, r in row.items() for d in r.divergences]
    failing = [f"  {v} {name}: property {p['property']} fails" for name, row in table.items()
               for v, r in row.items() for p in r.properties if p["status"] == "fails"]
    confirmed = [f"  {v} {name}: {p['property']}: {p['message']}" for name, row in table.items()
                 for v, r in row.items() for p in r.properties if p["status"] == "finding confirmed"]
    bugs = format_bug_rows(bug_rows(engine, versions, table), versions)
    return "\n".join(lines + (["notes:"] + notes if notes else [])
                     + (["divergences:"] + diverging if diverging else [])
                     + (["properties failing on the real code:"] + failing if failing else [])
                     + (["open-upstream findings confirmed on the real code:"] + confirmed if confirmed else [])
                     + bugs)


def parse_versions(text: str) -> list[str]:
    """`--versions A,B,...`: every item a release number, none empty."""
    from .source import check_version

    items = [v.strip() for v in text.split(",")]
    if not text.strip() or any(not v for v in items):
        raise ConfigError("--versions", "a comma-separated list of releases such as 0.27.1,0.28.0 (no empty item)",
                          text)
    return [check_version(v, "--versions") for v in dict.fromkeys(items)]


def to_json(result: TargetResult) -> dict[str, Any]:
    return result.to_json()
