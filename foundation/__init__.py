"""Helpers every layer needs and no layer owns: atomic file writes, field validation.

Imports numpy at most; never a picasso layer.
"""
