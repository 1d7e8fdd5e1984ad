"""The worker hands freed heap pages back when a rank's resident set grows (executor/process/allocator.py)."""

from __future__ import annotations

import executor.process.allocator as allocator

MIB = 1 << 20


def test_heap_is_trimmed_only_when_the_resident_set_grows(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_trim", lambda pad: calls.append(pad) or 1)
    rss = iter([500 * MIB] * 20 + [520 * MIB, 580 * MIB, 400 * MIB, 500 * MIB, 530 * MIB, 600 * MIB])
    trimmer = allocator.HeapTrimmer(rss=lambda: next(rss))
    done = [trimmer.after_step() for _ in range(26)]
    # steady at 500 MiB: no trim (520 <= 500 * 1.1 + 16); 580 is over: trim; the next step's 400
    # is the new level, and 500 > 456 trims; 530 is the level then, and 600 > 599 trims
    assert calls == [0, 0, 0] and trimmer.trims == 3
    assert [i for i, d in enumerate(done) if d] == [21, 23, 25]


def test_no_proc_means_no_trim(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_trim", lambda pad: calls.append(pad) or 1)
    trimmer = allocator.HeapTrimmer(rss=lambda: 0)
    assert not any(trimmer.after_step() for _ in range(50)) and calls == []


def test_glibc_trim_is_found_here():
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert allocator._trim is not None
        allocator._trim(0)  # callable: returns whether memory was released
