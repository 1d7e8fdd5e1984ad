"""Errors of the traces layer: one line naming the file, line and field when known."""

from __future__ import annotations


class TraceError(ValueError):
    """Bad or unreadable trace input. The message is one line, safe to show to a user."""
