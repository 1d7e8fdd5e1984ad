"""The commands' bars: foundation.progress's, counting bytes unless told otherwise (what the readers
and writers of synth, analyze and convert report)."""

from __future__ import annotations

from foundation.progress import Progress as _Progress


def Progress(label: str, enabled: bool | None = None, unit: str = "B") -> _Progress:  # noqa: N802 - a class to callers
    return _Progress(label, unit=unit, enabled=enabled)
