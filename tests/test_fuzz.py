"""Bounded fuzzing of every reader and command (issues 16, 29): no traceback, no internal error, no run
over 10 s of CPU, no invalid input accepted, no non-finite number reported or written, no error line over
300 characters, no input changed, no special file replaced, no result lost or duplicated.

A seeded generator (tests/fuzzkit.py, tests/fuzz_attacks.py): 120 cases of mutated inputs and flags, then
the attacks of issue 29 a few times each (indirect inputs, special files, two writers of one results file,
damaged resumed results, every command's bounds); about a minute. `python benchmarks/fuzz.py --cases 10000`
runs the long campaign.
"""

import random

import pytest

import fuzzkit
from fuzzkit import failed, make_case, run_case, summarize

ATTACK_CASES = {"indirect": 16, "special": 16, "concurrent": 2, "resumed": 12, "bounds": 60}


def _run(tmp_path, rng, n, label):
    outcomes = []
    for i in range(n):
        folder = tmp_path / f"{label}{i}"
        folder.mkdir()
        case = make_case(rng, folder)
        outcome = run_case(case, folder)
        outcome["argv"] = [a[:100] for a in case.argv]
        outcomes.append(outcome)
    return outcomes


@pytest.mark.fuzz
def test_fuzz_every_reader_and_command(tmp_path, monkeypatch):
    rng = random.Random(16)
    monkeypatch.setattr(fuzzkit, "KINDS", ("classic",))
    outcomes = _run(tmp_path, rng, 120, "c")
    for kind, n in ATTACK_CASES.items():
        monkeypatch.setattr(fuzzkit, "KINDS", (kind,))
        outcomes += _run(tmp_path, rng, n, kind)
    counts = summarize(outcomes)
    bad = [o for o in outcomes if failed(o)]
    assert not bad, (counts, [(o["argv"], o["kind"], o.get("detail") or o.get("exception"), o["stderr"][-200:])
                              for o in bad[:5]])
    assert counts["by_kind"] == {"classic": 120, **ATTACK_CASES}


def test_every_command_is_in_the_fuzzers_bounds(tmp_path):
    """A new command joins the `bounds` attack (tests/fuzz_attacks.py `_bounds`), or says why it has no
    option to bound (`COMMANDS_WITHOUT_BOUNDS`)."""
    import click

    from dlsim.cli import _register, main
    from fuzz_attacks import COMMANDS_WITHOUT_BOUNDS, bounded_commands
    _register()

    def leaves(group: click.Group, prefix: str) -> set[str]:
        out = set()
        for name, command in group.commands.items():
            path = f"{prefix}{name}"
            if isinstance(command, click.Group) and command.commands:
                out |= leaves(command, path + " ")
                if any(not p.is_flag and p.name != "json_out" for p in command.params if isinstance(p, click.Option)):
                    out.add(path)
            else:
                out.add(path)
        return out
    missing = leaves(main, "") - bounded_commands(tmp_path) - set(COMMANDS_WITHOUT_BOUNDS)
    assert not missing, f"commands the fuzzer never gives an out-of-bounds option: {sorted(missing)}"
