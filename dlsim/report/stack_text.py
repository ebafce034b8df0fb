"""Text of ``dlsim stacks`` and ``dlsim stacks show``."""

from __future__ import annotations

import textwrap
from typing import Any

from dlsim.spec.stack import RECORD_NAMES


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) if v else "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and v >= 1 << 20 and v % (1 << 20) == 0:
        return f"{v >> 20} MiB"
    return str(v)


def stacks_table(rows: list[dict[str, Any]]) -> str:
    """One line per stack: name, version, framework, what it is."""
    width = max((len(r["name"]) for r in rows), default=4)
    out = [f"{'stack':<{width}}  version / framework"]
    for r in rows:
        out.append(f"{r['name']:<{width}}  {r['version']} ({r['framework']})")
        if r.get("description"):
            out.append(" " * (width + 2) + r["description"])
    out.append("dlsim stacks show NAME: every key with the framework code it was read from; dlsim stacks diff A B: "
               "the keys two stacks set differently; --stack NAME to use one")
    return "\n".join(out)


def stack_table(rec: dict[str, Any]) -> str:
    """Every key of one stack, its value and its source."""
    out = [f"{rec['name']}: {rec['framework']}, {rec['version']}"]
    if rec.get("description"):
        out.append(rec["description"])
    if rec.get("repositories"):
        out.append("read in: " + ", ".join(rec["repositories"]))
    width = max((len(k) for k in rec["values"]), default=3)
    out.append("")
    names = {v: k for k, v in RECORD_NAMES.items()}
    for key, value in rec["values"].items():
        out.append(f"{key:<{width}}  {_value(value)}")
        source = rec["sources"].get(names.get(key, key)) or rec["sources"].get(key, "")
        out += textwrap.wrap(source, 96, initial_indent=" " * (width + 2) + "source: ",
                             subsequent_indent=" " * (width + 10))
    for note in rec.get("notes") or []:
        out += textwrap.wrap(note, 100, initial_indent="note: ", subsequent_indent="      ")
    return "\n".join(out)


def stack_diff_table(rec: dict[str, Any], sources: bool = False) -> str:
    """The keys two stacks set differently, side by side (each value with its source when `sources`);
    then the keys they agree on."""
    a, b = rec["a"], rec["b"]
    out = [f"{a['name']} ({a['version']}) against {b['name']} ({b['version']}): "
           f"{len(rec['differ'])} key(s) differ, {len(rec['same'])} agree"]
    rows = [(d["key"], _value(d["a"]), _value(d["b"])) for d in rec["differ"]]
    kw = max([len("key")] + [len(r[0]) for r in rows])
    aw = max([len(a["name"])] + [len(r[1]) for r in rows])
    if rows:
        out += ["", f"{'key':<{kw}}  {a['name']:<{aw}}  {b['name']}"]
    for d, (key, va, vb) in zip(rec["differ"], rows):
        out.append(f"{key:<{kw}}  {va:<{aw}}  {vb}")
        for name, source in ((a["name"], d["a_source"]), (b["name"], d["b_source"])) if sources else ():
            out += textwrap.wrap(source, 96, initial_indent=" " * (kw + 2) + f"{name}: ",
                                 subsequent_indent=" " * (kw + 4))
    if rec["same"]:
        out += [""] + textwrap.wrap("the same in both: " + "; ".join(f"{k} {_value(v)}" for k, v in rec["same"].items()),
                                    100, subsequent_indent="  ")
    if not sources:
        out.append("--sources: the framework code each value was read from")
    out.append(f"dlsim compare MODEL -c PROFILE --grid stack={a['name']},{b['name']}: what the difference costs")
    return "\n".join(out)
