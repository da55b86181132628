"""The scaling tables' number cells: a missing number (None, NaN, infinite) prints as an en dash."""
import math

import pytest

from rltok.analysis.table_cells import MISSING, interval, number


@pytest.mark.parametrize("missing", [None, math.nan, math.inf, -math.inf])
def test_missing_numbers_print_as_a_dash(missing):
    assert number(missing) == MISSING == "–"
    assert interval((missing, 2.0), ".1f") == "[–, 2.0]"


def test_numbers_take_the_format_asked():
    assert number(12345.678) == "1.23e+04"
    assert number(12345.678, ",.0f") == "12,346"
    assert number(-0.01234, "+.3f") == "-0.012"
    assert number(7, ".2f") == "7.00"
    assert interval((0.1, 0.25), "+.2f") == "[+0.10, +0.25]"
