"""Bounded fuzzing of every reader and command (issue 16): no traceback, no hang, no invalid input
accepted, no non-finite number reported, no error line over 300 characters.

A seeded generator (tests/fuzzkit.py); 150 cases here (~15 s); `python benchmarks/fuzz.py --cases 10000`
runs the long campaign.
"""

import random

import pytest

from fuzzkit import make_case, run_case, summarize


@pytest.mark.fuzz
def test_fuzz_every_reader_and_command(tmp_path):
    rng = random.Random(16)
    outcomes = []
    for i in range(150):
        folder = tmp_path / str(i)
        folder.mkdir()
        argv, invalid = make_case(rng, folder)
        outcome = run_case(argv, invalid)
        outcome["argv"] = [a[:100] for a in argv]
        outcomes.append(outcome)
    counts = summarize(outcomes)
    bad = [o for o in outcomes if o["traceback"] or o["slow"] or o["invalid_accepted"] or o["non_finite"]
           or o["long_error"]]
    assert not bad, (counts, [(o["argv"], o.get("exception"), o["stderr"][-200:]) for o in bad[:5]])
