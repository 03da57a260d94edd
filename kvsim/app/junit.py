"""JUnit XML reports: `--junit FILE` of check, repro, explore, oracle and conform.

Each builder takes the result records its command already builds for `--json` and returns `<testsuite>`
elements; `write(path, name, suites)` puts them under one `<testsuites>` and writes the file. The document
follows the Jenkins `junit-10.xsd` that CI systems read (Jenkins, GitLab; `tests/app/test_junit.py` validates
every command's file against it).

One `<testcase>` per property x variant (check), bug report (repro), invariant or hang search (explore),
kernel property x backend (oracle), target (conform). `classname` is `kvsim.<model>.<variant>`
(`kvsim.conform.<engine>.<release>` for conform, the release's dots as `_`). A violation is a `<failure>`:
`message` is the violation's message, the text repeats it and adds the counterexample and the `kvsim ...`
command line that replays it. A property that crashed, or a conform target that could not be loaded, is an
`<error>`; what did not run (a backend this machine lacks, a target absent from the release, a check cut
off by `--max-seconds` or a search bound) is `<skipped message=...>`.
"""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .. import __version__
from ..engine.canon import canonical_json, to_jsonable
from ..engine.errors import ConfigError
from ..engine.explore import DEFAULT_MAX_STATES
from ..engine.interrupt import stopped_by
from ..engine.params import param_args
from ..engine.system import UNREACHED

MAX_SECONDS_NOT_RUN = "not run: --max-seconds ran out before it started"


def not_run_message(stopped: str | None) -> str:
    """Why a check did not run: `--max-seconds` (`stopped` "max-seconds" or None), or an interrupt."""
    return MAX_SECONDS_NOT_RUN if stopped in (None, "max-seconds") else \
        f"not run: {stopped_by(stopped)} stopped the command before it started"


@dataclass
class Case:
    """One testcase: `outcome` is "passed", "failure", "error" or "skipped"."""

    name: str
    classname: str
    seconds: float = 0.0
    outcome: str = "passed"
    message: str = ""
    text: str = ""
    kind: str = ""  # the failure's or error's `type`
    output: str = ""  # <system-out>

    def element(self) -> ET.Element:
        case = ET.Element("testcase", name=_xml(self.name), classname=_xml(self.classname),
                          time=_seconds(self.seconds))
        if self.outcome != "passed":
            tag = self.outcome
            attrs = {"message": _xml(self.message)}
            if self.kind and tag != "skipped":
                attrs["type"] = _xml(self.kind)
            child = ET.SubElement(case, tag, attrs)
            if self.text:
                child.text = _xml(self.text)
        if self.output:
            ET.SubElement(case, "system-out").text = _xml(self.output)
        return case


# -- the five commands ---------------------------------------------------------------------------------

def check(doc: Mapping[str, Any]) -> ET.Element:
    """`kvsim check` (its --json document): one testcase per property on the variant."""
    doc = to_jsonable(doc)
    classname = _classname(doc["model"], doc["variant"])
    cases = []
    for r in doc["results"]:
        replay = r.get("replay") or check_command(doc, r["property"])
        cases.append(_property_case(r, r["property"], classname, replay))
        cases += [_reach_case(g, f"{r['property']} sometimes {g['name']}", classname, 0.0,
                              f"no case of {g['drawn']} drawn satisfies it ({g['doc']}): {r['property']} may hold "
                              "vacuously", f"not met in {g['drawn']} drawn cases (a bound, not a proof)",
                              check_command(doc, r["property"])) for g in r.get("reachability", ())]
    cases += [Case(name, classname, outcome="skipped", message=not_run_message(doc.get("stopped_by")))
              for name in doc["not_run"]]
    return suite(f"kvsim check {doc['model']}", cases,
                 {"variant": doc["variant"], "seed": doc["seed"], "max_examples": doc["max_examples"],
                  "params": doc["params"], "backend": doc["backend"], "complete": doc["complete"]})


def repro(results: Sequence[Any], not_run: Sequence[str], seed: int, stopped: str | None = None,
          errors: Sequence[Mapping[str, str]] = ()) -> ET.Element:
    """`kvsim repro` (its ReproResult records): one testcase per bug report; a report that does not hold fails,
    and one whose run raised or whose worker process died (`errors`: id and one line) is an error."""
    cases = []
    for r in results:
        doc = to_jsonable(r.to_json())
        case = Case(doc["id"], _classname(doc["model"], doc["variant"]), doc["seconds"])
        shown = _counterexample(doc["counterexample"])
        if r.ok:
            case.output = (f"reproduced on {doc['variant']}: {doc['message']}" if doc["reproduced"]
                           else f"not reproduced on {doc['variant']}, as catalogued") + shown
        else:
            case.outcome, case.kind, case.message = "failure", "bug report", _repro_problem(doc, r.bug.fix_variant)
            detail = f"\n{doc['check']} on {doc['variant']}: {doc['message']}" if doc["message"] else ""
            case.text = case.message + detail + shown + f"\nreplay: kvsim repro {doc['id']} --seed {seed}"
        cases.append(case)
    cases += [Case(e["id"], "kvsim.repro", outcome="error", kind="run", message=e["error"]) for e in errors]
    cases += [Case(bug, "kvsim.repro", outcome="skipped", message=not_run_message(stopped)) for bug in not_run]
    return suite("kvsim repro", cases, {"seed": seed, "complete": not not_run})


def explore(doc: Mapping[str, Any], args: Any, given: Mapping[str, Any], liveness: str | None) -> ET.Element:
    """`kvsim explore` (its --json document): one testcase per invariant, one for the hang search
    (`liveness`: its name, None with --no-liveness) and one per reachability declaration (`sometimes NAME`: a
    failure where a complete search never met it). One search checks them all: each testcase's time is an
    equal share of the search's. Checks a bound cut short without a violation are skipped (nothing proved)."""
    doc = to_jsonable(doc)
    classname = _classname(doc["model"], doc["variant"])
    names = list(doc.get("coverage", {}).get("invariants", {}))
    names += [liveness] if liveness else []
    violations = {v["property"]: v for v in doc["violations"]}
    names += [n for n in violations if n not in names]
    command = explore_command(doc["model"], doc["variant"], given, args)
    reach = doc.get("reachability", [])
    share = doc["seconds"] / max(len(names) + len(reach), 1)
    cases = []
    for name in names:
        case = Case(name, classname, share)
        v = violations.get(name)
        if v is not None:
            steps = "".join(f"\n  {canonical_json(a)}" for a in v["trace"])
            saved = f"\nreplay the saved path: kvsim replay {shlex.quote(args.save)}" if args.save else ""
            case.outcome, case.kind, case.message = "failure", v["kind"], v["message"]
            case.text = (f"{v['kind']} {name}: {v['message']}\npath ({len(v['trace'])} steps):{steps}"
                         f"\nreplay: {command}{saved}")
        elif doc["bound_hit"]:
            case.outcome = "skipped"
            case.message = (f"INCOMPLETE: {stopped_by(doc['bound_hit'])} stopped the search before every reachable "
                            "state was seen; nothing was found, and nothing is proved")
        cases.append(case)
    cases += [_reach_case(r, f"sometimes {r['name']}", classname, share,
                          f"no reachable state satisfies it ({r['doc']})",
                          f"not reached within the bound ({stopped_by(doc['bound_hit'])})", command) for r in reach]
    return suite(f"kvsim explore {doc['model']}", cases,
                 {"variant": doc["variant"], "params": doc["params"], "states": doc["states"],
                  "transitions": doc["transitions"], "depth": doc["depth"], "bound_hit": doc["bound_hit"],
                  "store": doc["store"], "symmetry": doc["symmetry"]}, seconds=doc["seconds"])


def _reach_case(reach: Mapping[str, Any], name: str, classname: str, seconds: float, unreached: str, bounded: str,
                replay: str) -> Case:
    """One reachability declaration's testcase (explore's over states, check's over drawn cases): a failure where
    it is unreached (`unreached`: why, then the `replay` line), skipped where a bound stopped short of it."""
    case = Case(name, classname, seconds)
    if reach["status"] == UNREACHED:
        case.outcome, case.kind = "failure", "unreached"
        case.message = f"sometimes {reach['name']}: {unreached}"
        case.text = f"{case.message}\nreplay: {replay}"
    elif not reach["reached"]:
        case.outcome, case.message = "skipped", f"sometimes {reach['name']}: {bounded}"
    return case


def oracle(doc: Mapping[str, Any], max_examples: int, seed: int | None) -> ET.Element:
    """`kvsim oracle` (its --json document): one testcase per kernel property and backend, on the fixed
    variant; a backend this machine lacks is skipped with the reason."""
    doc = to_jsonable(doc)
    cases = []
    for row in doc["checks"]:
        model, _, prop = row["name"].partition(":")
        backend = row["backend"]
        replay = row.get("replay") or (f"kvsim check {model} --property {prop} --max-examples {max_examples} "
                                       f"--backend {backend}" + (f" --seed {seed}" if seed is not None else ""))
        cases.append(_property_case(row, f"{prop}[{backend}]", _classname(model, "fixed"), replay))
    for entry in doc["not_run"]:  # "model:property on backend"
        name, _, backend = entry.partition(" on ")
        model, _, prop = name.partition(":")
        cases.append(Case(f"{prop}[{backend}]", _classname(model, "fixed"), outcome="skipped",
                          message=not_run_message(doc.get("stopped_by"))))
    return suite("kvsim oracle", cases, {"seed": seed, "max_examples": max_examples, "complete": doc["complete"],
                                         "backends": [b["name"] for b in doc["backends"] if b["available"]]})


def conform(doc: Mapping[str, Any], args: Any) -> ET.Element:
    """`kvsim conform ENGINE` on one release or tree (its --json document): one testcase per target."""
    doc = to_jsonable(doc)
    cases = [_target_case(doc["engine"], doc["version"], r, args) for r in doc["results"]]
    release = doc["version"] or doc["origin"]
    return suite(f"kvsim conform {doc['engine']} {release}", cases,
                 {"engine": doc["engine"], "version": doc["version"], "origin": doc["origin"],
                  "max_examples": args.max_examples, "seed": args.seed, "device": args.device})


def conform_error(args: Any, message: str) -> ET.Element:
    """`kvsim conform` that failed before any target ran (a failed download, a source that is not the engine):
    one testcase with the `<error>`, so CI shows why and not an empty report."""
    release = args.version or args.from_path or args.versions or "default release"
    case = Case("kvsim conform", _classname(f"conform.{args.engine}", str(release)), outcome="error",
                kind="setup", message=message, text=message)
    return suite(f"kvsim conform {args.engine} {release}", [case], {"engine": args.engine})


def mutation(doc: Mapping[str, Any]) -> ET.Element:
    """`kvsim conform ENGINE --mutants` (its --json document): one testcase per target; an undocumented
    surviving mutant is a failure naming each survivor, an unmutated run that does not conform an error."""
    doc = to_jsonable(doc)
    release = doc["version"] or doc["origin"]
    cases = []
    for r in doc["mutation"]:
        case = Case(r["target"], _classname(f"conform.{doc['engine']}.mutants", release), r["seconds"])
        summary = f"{r['mutants']} mutants, {r['killed']} killed, {r['survived']} survived, score {r['score']}%"
        if r["status"].startswith("baseline"):
            case.outcome, case.kind, case.message = "error", "baseline", f"{r['status']}: {r['note']}"
        elif r["survivors"]:
            case.outcome, case.kind, case.message = "failure", "surviving mutants", summary
            case.text = summary + "".join(f"\nsurvived: {s['label']}" for s in r["survivors"])
        elif r["status"] != "measured":
            case.outcome, case.message = "skipped", f"{r['status']}: {r['note']}"
        else:
            case.output = summary
        cases.append(case)
    return suite(f"kvsim conform {doc['engine']} {release} --mutants", cases, {"engine": doc["engine"]})


def conform_table(doc: Mapping[str, Any], args: Any) -> list[ET.Element]:
    """`kvsim conform ENGINE --versions ...` (its --json document): one testsuite per release."""
    doc = to_jsonable(doc)
    suites = []
    for version in doc["versions"]:
        cases = [_target_case(doc["engine"], version, row[version], args) for row in doc["table"].values()]
        suites.append(suite(f"kvsim conform {doc['engine']} {version}", cases,
                            {"engine": doc["engine"], "version": version, "max_examples": args.max_examples,
                             "seed": args.seed, "device": args.device}))
    return suites


# -- the replay command lines ----------------------------------------------------------------------------

def check_command(doc: Mapping[str, Any], prop: str) -> str:
    """The `kvsim check` line that reruns one property of a check document."""
    cmd = f"kvsim check {doc['model']} --variant {doc['variant']} --property {prop} " \
          f"--max-examples {doc['max_examples']}"
    cmd += f" --backend {doc['backend']}" if doc.get("backend") else ""
    return cmd + _params(doc.get("params") or {}) + (f" --seed {doc['seed']}" if doc["seed"] is not None else "")


def explore_command(model: str, variant: str, given: Mapping[str, Any], args: Any) -> str:
    """The `kvsim explore` line that repeats the search: the parameters the user set and the bounds."""
    cmd = f"kvsim explore {model} --variant {variant}" + _params(given)
    if args.max_depth is not None:
        cmd += f" --max-depth {args.max_depth}"
    cmd += f" --max-states {args.max_states}" if args.max_states != DEFAULT_MAX_STATES else ""
    cmd += f" --store {args.store}" if args.store != "full" else ""
    cmd += " --no-symmetry" if args.no_symmetry else ""
    return cmd + (" --no-liveness" if args.no_liveness else "")


def conform_command(engine: str, version: str | None, target: str, args: Any) -> str:
    """The `kvsim conform` line that reruns one target on the same release or tree."""
    where = f"--from {shlex.quote(args.from_path)}" if args.from_path else f"--version {version}"
    cmd = f"kvsim conform {engine} {where} --target {shlex.quote(target)} --max-examples {args.max_examples}"
    cmd += f" --seed {args.seed}" if args.seed is not None else ""
    return cmd + (f" --device {args.device}" if args.device != "cpu" else "")


# -- the document ------------------------------------------------------------------------------------------

def suite(name: str, cases: Sequence[Case], properties: Mapping[str, Any] | None = None,
          seconds: float | None = None) -> ET.Element:
    """A `<testsuite>` with its counts; `seconds` defaults to the sum of the cases' times."""
    total = sum(c.seconds for c in cases) if seconds is None else seconds
    element = ET.Element("testsuite", name=_xml(name), tests=str(len(cases)),
                         failures=str(sum(c.outcome == "failure" for c in cases)),
                         errors=str(sum(c.outcome == "error" for c in cases)),
                         skipped=str(sum(c.outcome == "skipped" for c in cases)), time=_seconds(total))
    props = ET.SubElement(element, "properties")
    for key, value in {"kvsim_version": __version__, **(properties or {})}.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else canonical_json(value)
        ET.SubElement(props, "property", name=_xml(key), value=_xml(text))
    element.extend(c.element() for c in cases)
    return element


def document(name: str, suites: Iterable[ET.Element]) -> ET.ElementTree:
    """`<testsuites>` around `suites`, with the totals."""
    suites = list(suites)
    root = ET.Element("testsuites", name=_xml(name))
    for attr in ("tests", "failures", "errors"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    root.set("time", _seconds(sum(float(s.get("time", "0")) for s in suites)))
    root.extend(suites)
    ET.indent(root)
    return ET.ElementTree(root)


def write(path: str, name: str, suites: Iterable[ET.Element]) -> None:
    """Write the report; a path that cannot be written is a ConfigError on --junit."""
    tree = document(name, suites)
    try:
        tree.write(path, encoding="utf-8", xml_declaration=True)
    except (OSError, ValueError) as exc:
        raise ConfigError("--junit", "a writable file path", path, getattr(exc, "strerror", None) or str(exc)) \
            from None


# -- helpers -----------------------------------------------------------------------------------------------

def _property_case(r: Mapping[str, Any], name: str, classname: str, replay: str) -> Case:
    """A property run (check row or oracle row): passed, failed, error or skipped."""
    case = Case(name, classname, r.get("seconds") or 0.0)
    status = r["status"]
    if status == "skipped":
        case.outcome, case.message = "skipped", r.get("message") or "skipped"
    elif status != "passed":
        case.outcome = "failure" if status == "failed" else "error"
        case.kind = "property" if status == "failed" else "crash"
        case.message = r.get("message") or status
        case.text = case.message + _counterexample(r.get("counterexample")) + f"\nreplay: {replay}"
    return case


def _target_case(engine: str, version: str | None, r: Mapping[str, Any], args: Any) -> Case:
    case = Case(r["target"], _classname(f"conform.{engine}", version or "local"), r["seconds"])
    status = r["status"]
    failing = [p for p in r["properties"] if p["status"] == "fails"]
    notes = [f"property {p['property']}: {p['status']} {p['message']}".rstrip()
             for p in r["properties"] if p["status"] != "holds"]
    summary = f"{r['compared']} calls compared, {r['divergent']} divergent" + (f"\n{r['note']}" if r["note"] else "")
    if status in ("not present", "skipped", "not run", "incomplete"):
        case.outcome, case.message = "skipped", f"{status}: {r['note']}" if r["note"] else status
    elif status == "error":
        case.outcome, case.kind, case.message = "error", "load", r["note"] or "error"
        case.text = case.message + f"\nreplay: {conform_command(engine, version, r['target'], args)}"
    elif status == "diverges":
        problems = ([f"the {r.get('subject', 'upstream')} code diverges from the model: "
                     + (r["divergences"][0].get("difference") or "")] if r["divergent"] else [])
        problems += [f"property {p['property']} fails: {p['message']}" for p in failing]
        from ..conform.report import divergence_lines

        shown = "".join("\n" + "\n".join(divergence_lines(d, r.get("subject", "upstream"), "")) for d in r["divergences"])
        shown += "".join(f"\nproperty {p['property']} input {canonical_json(p['input'])}" for p in failing
                         if p.get("input") is not None)
        shown += ("\nthe code under test logged: " + " | ".join(r["logged"][:6])) if r.get("logged") else ""
        case.outcome, case.kind, case.message = "failure", "divergence", "; ".join(problems) or "diverges"
        case.text = (summary + shown + "".join(f"\n{n}" for n in notes)
                     + f"\nreplay: {conform_command(engine, version, r['target'], args)}")
    else:
        case.output = summary + "".join(f"\n{n}" for n in notes)
    return case


def _repro_problem(doc: Mapping[str, Any], fix_variant: str | None) -> str:
    """Why a bug report does not hold, in one line."""
    if doc["status"] == "not reproducible" and doc["reproduced"]:
        return f"catalogued as not reproducible, but {doc['check']} fails on {doc['variant']}"
    if not doc["reproduced"]:
        searched = f"{doc['examples']} examples" if doc["examples"] is not None else f"{doc['states']} states"
        return f"did not reproduce: {doc['check']} holds on {doc['variant']} ({searched} searched)"
    return f"reproduced on {doc['variant']}, but {doc['check']} also fails on {fix_variant or 'fixed'} (the fix)"


def _counterexample(value: Any) -> str:
    """A counterexample as text lines: a step program, an action path, or the case as JSON."""
    if value is None or value == {}:
        return ""
    if isinstance(value, dict) and value.get("program"):
        return "\ncounterexample:" + "".join(f"\n  {line}" for line in value["program"])
    if isinstance(value, dict) and isinstance(value.get("trace"), list):
        return f"\ncounterexample path ({len(value['trace'])} steps):" + "".join(
            f"\n  {canonical_json(a)}" for a in value["trace"])
    if isinstance(value, dict):  # one line per part of the case; its message is already the failure's
        return "\ncounterexample:" + "".join(f"\n  {key}: {canonical_json(part)}"
                                              for key, part in sorted(value.items()) if key != "message")
    return f"\ncounterexample: {canonical_json(value)}"


def _params(values: Mapping[str, Any]) -> str:
    return " " + param_args(dict(sorted(values.items()))) if values else ""


def _classname(model: str, variant: str) -> str:
    return f"kvsim.{model}.{variant.replace('.', '_')}"


def _seconds(value: float) -> str:
    """Three decimals: the schema's SUREFIRE_TIME."""
    return f"{max(float(value), 0.0):.3f}"


def _xml(text: Any) -> str:
    """`text` with every character XML 1.0 cannot carry (NUL, escape, other C0 controls) as a Python escape."""
    text = str(text)
    return "".join(ch if ch in "\t\n\r" or " " <= ch <= "\ud7ff" or "\ue000" <= ch <= "\ufffd"
                   or ch >= "\U00010000" else ascii(ch)[1:-1] for ch in text)
