"""Child entry point for AddressSanitizer runs (started by `asan.run_child` with libasan preloaded).

    python -m kvsim.gpu_oracle.runtime.asan_run case FAMILY FILE|-
        one case document of kernel family FAMILY (`KernelFamily.run_document`), unchecked
    python -m kvsim.gpu_oracle.runtime.asan_run property MODULE NAME [--variant V] [--max-examples N] [--seed S]
        the kernel property NAME declared in MODULE, on backend cpu-shim-asan (`kvsim.engine.runner`)

Prints one JSON line on success (a case's result, or the property's
`PropertyResult.to_json()`). An out-of-bounds store never gets that far:
ASan prints its report and exits with `asan.ASAN_EXIT_CODE`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from .shim import asan_loaded


def run_case(family_name: str, document: dict[str, Any]) -> dict[str, Any]:
    from .family import family

    return family(family_name).run_document(document)


def run_property(module: str, name: str, variant: str, max_examples: int, seed: int | None) -> dict[str, Any]:
    from kvsim.engine.property import KvProperty
    from kvsim.engine.registry import REGISTRY
    from kvsim.engine.runner import run_property as run

    prop = next(p for p in vars(importlib.import_module(module)).values()
                if isinstance(p, KvProperty) and p.name == name and p.home == module)
    if prop.model not in REGISTRY.models:  # the runner resolves the variant against the model's descriptor
        package = importlib.import_module(f"kvsim.models.{prop.model.replace('-', '_')}")
        REGISTRY.add_model(package.DESCRIPTOR)
    return run(prop, variant, max_examples=max_examples, seed=seed, backend="cpu-shim-asan").to_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvsim.gpu_oracle.runtime.asan_run")
    sub = parser.add_subparsers(dest="command", required=True)
    case = sub.add_parser("case")
    case.add_argument("family", help="kernel family (a folder under kernels/)")
    case.add_argument("file", help="JSON case document, or - for stdin")
    prop = sub.add_parser("property")
    prop.add_argument("module", help="the module declaring the kernel property")
    prop.add_argument("name")
    prop.add_argument("--variant", default="fixed")
    prop.add_argument("--max-examples", type=int, default=50)
    prop.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    if not asan_loaded():
        print("asan_run: libasan is not preloaded; start it through kvsim.gpu_oracle.runtime.asan", file=sys.stderr)
        return 2
    if args.command == "case":
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
        result = run_case(args.family, json.loads(text))
    else:
        result = run_property(args.module, args.name, args.variant, args.max_examples, args.seed)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
