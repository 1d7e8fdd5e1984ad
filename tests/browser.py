"""Open an HTML report in headless Chromium: console messages, JS errors, a screenshot.

Chromium's `--enable-logging=stderr` prints every console message as
`INFO:CONSOLE(...)] "text", source: ...` without its level, so the report's head
script (simulator.report.ERROR_HOOK_JS) prefixes console.error/warn calls and uncaught errors with a
marker that this module looks for; Chromium's own "Uncaught ..." lines count too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from simulator.report import ERROR_MARK

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
)

_CONSOLE = re.compile(r':CONSOLE(?:\(\d+\))?(?::\d+)?\] "(.*)", source: (.*)$')


@dataclass
class BrowserResult:
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    returncode: int = 0


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def open_in_chromium(
    page: str | os.PathLike, screenshot: str | os.PathLike | None = None,
    width: int = 1400, height: int = 3000, timeout_s: float = 120.0, virtual_time_ms: int = 8000,
) -> BrowserResult:
    """Load `page` headless, collect console output and errors, save a PNG screenshot."""
    exe = find_chromium()
    if exe is None:
        raise OSError("chromium is not installed (Debian: apt-get install -y chromium)")
    page = Path(page).resolve()
    if not page.is_file():
        raise OSError(f"{page}: no such report")
    shot = Path(screenshot).resolve() if screenshot else page.with_suffix(".png")
    with tempfile.TemporaryDirectory(prefix="picasso-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--virtual-time-budget={virtual_time_ms}", f"--screenshot={shot}", page.as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    res = BrowserResult(returncode=proc.returncode, screenshot=shot if shot.is_file() else None)
    for line in (proc.stderr + proc.stdout).splitlines():
        m = _CONSOLE.search(line)
        if not m:
            continue
        text = m.group(1)
        res.console.append(text)
        if ERROR_MARK in text or text.startswith("Uncaught") or "Uncaught " in text:
            res.errors.append(f"{text} ({m.group(2)})")
    return res
