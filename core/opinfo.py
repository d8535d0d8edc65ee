"""`isthmus ops`: what the registry holds, per op: inputs, attributes, gradient, kernel."""
from __future__ import annotations

import json
from typing import Dict, List

import isthmus.core

from . import registry


def op_table() -> List[Dict[str, object]]:
    rows = []
    for name in registry.registered():
        d = registry.get(name)
        rows.append({"op": name, "inputs": list(d.inputs),
                     "attrs": {k: ("required" if v is registry.REQUIRED else repr(v)) for k, v in d.attrs.items()},
                     "gradient": d.grad is not None, "stateful": d.stateful, "doc": d.doc})
    return rows


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the table as JSON")


def run(args) -> int:
    rows = op_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["op"]) for r in rows)
    for r in rows:
        flags = ("grad " if r["gradient"] else "     ") + ("stateful" if r["stateful"] else "")
        print(f"{r['op']:<{width}}  ({', '.join(r['inputs'])})  {flags}")
    print(f"{len(rows)} ops")
    return 0
