"""Helpers every layer needs and no layer owns: atomic file writes, field validation, and the
bounded reading of files someone else wrote (documents, text encodings, .npz archives).

Imports numpy (and PyYAML, lazily, for YAML documents); never a picasso layer.
"""
