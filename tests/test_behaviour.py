"""Refactors must not change what training computes: every case of tests/behaviour_cases.py
(the default and published recipes, two stages, every comparison method) reruns and must give
the recorded losses, rates, validation numbers and weights bit for bit.

Bit-exact float results depend on the torch build and the CPU's instruction set, so on another
machine the test skips rather than fail; rerecord there with `python tests/behaviour_cases.py`.
"""

from __future__ import annotations

import json

import pytest

from behaviour_cases import CASES, FIXTURE, machine, run

RECORDED = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_training_reproduces_recorded_behaviour(case, tmp_path):
    if RECORDED["machine"] != machine():
        pytest.skip(f"recorded on {RECORDED['machine']}, this is {machine()}")
    want = RECORDED["cases"][case]
    got = run(case, tmp_path)
    for key in want:
        assert got[key] == want[key], f"{case}: {key} changed"
