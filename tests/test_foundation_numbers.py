"""foundation.numbers: every number a person reads (terminal tables, HTML pages) in one style:
separators, no scientific notation for counts, percentages, SI rates, headers in words."""

from __future__ import annotations

from foundation.numbers import cell, count, duration_us, header, percent, si
from simulator.report import table_html


def test_counts_have_separators_and_no_exponent():
    assert count(16230.4) == "16,230" and count(1.623e4) == "16,230"
    assert count(251827705) == "251,827,705" and count(1.04e8) == "104,000,000"
    assert count(12.345) == "12.3" and count(0.4942) == "0.494" and count(3.0) == "3" and count(0) == "0"
    assert "e" not in count(34750.0) and count(None) == ""


def test_rates_durations_percentages():
    assert si(2.2e11, "B/s") == "220 GB/s" and si(1.5e9, "B/s") == "1.50 GB/s" and si(12, "B/s") == "12.0 B/s"
    assert duration_us(34750) == "34.8 ms" and duration_us(812.3) == "812 us" and duration_us(1.52e6) == "1.52 s"
    assert percent(0.123) == "12.3%" and percent(None) == ""


def test_headers_are_words_with_units():
    assert header("exchange_us") == "exchange (us)" and header("hbm_peak_bytes") == "HBM peak (bytes)"
    assert header("measured samples/s") == "measured samples/s" and header("mape") == "MAPE"
    assert cell(None) == "" and cell([1, 2.5]) == "1, 2.5" and cell(True) == "yes"


def test_html_tables_read_like_the_terminal():
    page = table_html([{"samples_per_s": 16230.4, "rows": 251827705, "exchange_us": None, "iteration_us": 3.475e4}])
    assert "16,230" in page and "251,827,705" in page and "34,750" in page
    assert "e+0" not in page and "None" not in page
    assert "samples per s" in page or "samples/s" in page or "samples per" in page
    assert "exchange (us)" in page and "exchange_us" not in page and "iteration (us)" in page
