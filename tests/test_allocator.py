"""The worker hands freed heap pages back every few steps (executor/allocator.py)."""

from __future__ import annotations

import executor.allocator as allocator


def test_heap_is_trimmed_every_few_steps(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_trim", lambda pad: calls.append(pad) or 1)
    for s in range(3 * allocator.TRIM_EVERY):
        allocator.trim_heap(s)
    assert calls == [0, 0, 0]


def test_glibc_trim_is_found_here():
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert allocator._trim is not None
        allocator._trim(0)  # callable: returns whether memory was released
