"""The column-layout flags of `picasso analyze` and `picasso convert`, read the same way by both."""

from __future__ import annotations

import argparse
from typing import Any


def add_layout_args(p: argparse.ArgumentParser, title: str, dense_flag: str = "--dense") -> None:
    """The reader's column-layout options (traces.readers), in a group named `title`;
    `dense_flag` names the dense-columns flag (convert's --dense is its transform)."""
    g = p.add_argument_group(title)
    g.add_argument("--label", default=None, help="label column (default: label/click if present)")
    g.add_argument(dense_flag, dest="dense_cols", default=None, help="comma-separated dense columns")
    g.add_argument("--categorical", default=None, help="comma-separated categorical columns (default: the rest)")
    g.add_argument("--skip", default=None, help="comma-separated columns to ignore")
    g.add_argument("--sep", default=None,
                   help="field separator: one character, \\t, or tab/comma/semicolon/space/pipe "
                        "(default: tab for criteo and .tsv, else comma)")
    g.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                   help="line 1 does (--header) or does not (--no-header; columns are then c1, c2, ...) name the "
                        "columns (default: criteo none, others a header, checked to be one)")
    g.add_argument("--multi-sep", default=None, help="separator of multi-valued categorical values, e.g. '|'")
    g.add_argument("--multi", default=None, help="comma-separated multi-valued columns (default: all categorical)")
    g.add_argument("--field-map", default=None, help="libsvm: file of 'name lo hi' index ranges per field")
    g.add_argument("--dense-fields", default=None, help="libsvm: comma-separated fields holding dense values")


def layout_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword options the readers take, from the flags add_layout_args defined."""
    return {"label": args.label, "dense": args.dense_cols, "categorical": args.categorical, "skip": args.skip,
            "sep": args.sep, "header": args.header, "multi_sep": args.multi_sep, "multi": args.multi,
            "field_map": args.field_map, "dense_fields": args.dense_fields}
