"""Workflows that span layers (demo, calibrate, validate, report)."""
