"""The demo's measured comparison: each plan run several times, taking turns; medians with their
spread; a plan whose runs disagree beyond the typical spread is flagged; a speedup inside the
spreads is 'within noise'; the summary's samples/s always agree with its milliseconds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from validation.demo import demo_summary, measured_line, summary_lines
from validation.repeats import (
    MachineLoad,
    Repeated,
    Verdict,
    compare_to,
    measure_interleaved,
    measure_until_decided,
    noisy,
    speedup,
    typical_spread,
)


def test_plans_take_turns_and_the_median_ignores_one_slow_spell():
    calls = []
    times = {"picasso": [25.0, 26.0, 25.5], "dp-hot-only": [40.0, 117.5, 41.0], "naive": [60.0, 61.0, 59.0]}

    def measure(name, r):
        calls.append((name, r))
        return times[name][r] * 1e3

    reps = measure_interleaved(list(times), 3, measure, lambda n: 1024)
    assert calls == [(n, r) for r in range(3) for n in times]  # round robin, not one plan's runs in a row
    assert reps["dp-hot-only"].median_us == 41e3  # the 117.5 ms run (a slow spell) does not set the result
    typical = typical_spread(reps)
    assert noisy(reps["dp-hot-only"], typical) and not noisy(reps["picasso"], typical)
    assert speedup(reps["picasso"], reps["dp-hot-only"]).ratio == 41.0 / 25.5


def test_a_speedup_inside_the_spreads_is_within_noise():
    a = Repeated("picasso", 512, [30e3, 33e3, 36e3])
    b = Repeated("base", 512, [31e3, 34e3, 37e3])
    assert not speedup(a, b).resolved and speedup(a, b).text().endswith("(within noise)")
    c = Repeated("slow", 512, [60e3, 61e3, 62e3])
    assert speedup(a, c).resolved


runs = st.lists(st.floats(1e3, 1e6), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(mine=runs, base=runs, stale_sps=st.floats(1.0, 1e7))
def test_summary_faster_by_ms_is_faster_by_samples_per_s(mine, base, stale_sps):
    """The summary's samples/s come from the same medians as its ms (they came from each run's
    mean throughput, which disagreed: faster by ms, slower by samples/s)."""
    reps = {"picasso": Repeated("picasso", 1024, mine), "base": Repeated("base", 1024, base)}
    ctx = {"predicted": {n: SimpleNamespace(iteration_us=1e4) for n in reps},
           "measured": {n: SimpleNamespace(iteration_us=float(sum(r.runs_us) / len(r.runs_us)),
                                           samples_per_s=stale_sps) for n, r in reps.items()},
           "repeats": reps,
           "validate": ({"plans": 0, "mape": 0.0, "spearman": None}, [])}
    s = demo_summary(ctx, [], 1.0, Path("r.html"))
    ms, sps = s["measured_iteration_us"], s["samples_per_s"]
    assert (ms["picasso"] < ms["base"]) == (sps["picasso"] > sps["base"])
    assert (s["measured_speedup"]["base"] > 1) == (sps["picasso"] > sps["base"])
    assert s["measured_spread"]["picasso"] >= 0 and "typical_spread" in s
    line = measured_line(s)
    assert "median of" in line and "spread" in line


def test_the_headline_says_when_runs_disagree():
    reps = {"picasso": Repeated("picasso", 1024, [25e3, 26e3, 25.5e3]),
            "dp-hot-only": Repeated("dp-hot-only", 1024, [40e3, 117.5e3, 41e3]),
            "naive": Repeated("naive", 1024, [60e3, 61e3, 59e3])}
    ctx = {"predicted": {n: SimpleNamespace(iteration_us=1e4) for n in reps}, "repeats": reps,
           "measured": {n: SimpleNamespace(iteration_us=r.median_us, samples_per_s=1.0) for n, r in reps.items()},
           "validate": ({"plans": 0, "mape": 0.0, "spearman": None}, [])}
    s = demo_summary(ctx, [], 1.0, Path("r.html"))
    assert s["noisy"] == ["dp-hot-only"]
    line = measured_line(s)
    assert "dp-hot-only 1.61x" in line and "dp-hot-only's runs disagree" in line and "naive 2.35x (spread" in line
    printed = summary_lines(s)
    assert printed[0].startswith("picasso demo: done in") and line.strip() in [p.strip() for p in printed]


def test_runs_repeat_until_decided_and_only_the_undecided_run_again():
    """Two rounds of every plan; then only the baselines still inside the spread, with the plan."""
    times = {"picasso": [25.0, 26.0, 25.5, 25.2], "slow": [60.0, 61.0, 59.0, 60.0],
             "close": [25.5, 27.0, 24.0, 26.0]}
    calls, rounds = [], []

    def measure(name, r):
        calls.append((name, r))
        return times[name][r] * 1e3

    reps = measure_until_decided(list(times), 2, 4, measure, lambda n: 1024, lambda r, todo: rounds.append(todo))
    assert calls[:6] == [(n, r) for r in range(2) for n in times]
    assert rounds[2:] == [["picasso", "close"], ["picasso", "close"]]  # 'slow' was decided after two rounds
    assert len(reps["slow"].runs_us) == 2 and len(reps["close"].runs_us) == 4 == len(reps["picasso"].runs_us)
    slow, close = compare_to(reps["picasso"], reps["slow"]), compare_to(reps["picasso"], reps["close"])
    assert slow.verdict == Verdict.FASTER and "faster than slow, 2.39x" in slow.text()
    assert close.verdict == Verdict.UNDECIDED


def test_undecided_says_because_with_the_numbers_and_what_to_do():
    mine = Repeated("picasso", 512, [30e3, 33e3, 36e3])
    base = Repeated("torchrec-like", 512, [31e3, 34e3, 37e3])
    c = compare_to(mine, base)
    busy = MachineLoad(9.5, 11.2, 2)
    text = c.text(busy)
    assert c.verdict == Verdict.UNDECIDED and "undecided, because" in text
    assert "3.0%" in text and "18.2% + 17.6%" in text and "after 3 and 3 runs" in text
    assert "load average 9.5 at the start and 11.2 at the end on 2 cores" in text and "quiet" in text
    quiet = c.text(MachineLoad(0.3, 0.4, 2))
    assert "other work" not in quiet and "--max-run-repeats" in quiet


def test_terminal_lines_carry_the_conclusion_the_report_shows():
    reps = {"picasso": Repeated("picasso", 1024, [25e3, 26e3]), "naive": Repeated("naive", 1024, [60e3, 61e3])}
    ctx = {"predicted": {n: SimpleNamespace(iteration_us=1e4) for n in reps}, "repeats": reps,
           "load": MachineLoad(1.0, 1.2, 2),
           "validate": ({"plans": 6, "plans_fit": 3, "mape": 0.252, "spearman": 0.8, "failed": [],
                         "microbench_only": {"mape": 0.4}}, [])}
    s = demo_summary(ctx, [], 12.0, Path("r.html"))
    printed = "\n".join(summary_lines(s))
    assert s["verdicts"] == {"naive": "faster"} and s["conclusion"][0] in printed
    assert "validation: 6 plans validated after a refit on 3 others, MAPE 25.2% (microbenchmarks alone: 40.0%)" \
        in printed
    ctx["validate"][0]["refit"] = {"choice": {"kept": "microbench"}}
    kept = "\n".join(summary_lines(demo_summary(ctx, [], 12.0, Path("r.html"))))
    assert "6 plans validated with the measured rates (a refit on 3 others did worse, so it was not kept)" in kept
    assert "microbenchmarks alone" not in kept
