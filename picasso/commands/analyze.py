"""`picasso analyze`: read a click log and write its AccessProfile (+ optional HTML report)."""

from __future__ import annotations

import argparse

FORMATS = ("criteo", "avazu", "csv", "parquet", "libsvm")


def register(sub, common) -> None:
    p = sub.add_parser("analyze", parents=[common], help="profile the ID access frequencies of a click log")
    p.add_argument("data", help="click log (plain or gzip; Parquet for --format parquet)")
    p.add_argument("--format", required=True, choices=FORMATS, help="input format")
    p.add_argument("--batch-size", type=int, default=4096, help="batch size for the batch-presence histogram")
    p.add_argument("--scale-to", type=_count, default=None, metavar="ROWS",
                   help="extrapolate the profile to this many rows (e.g. 45840617)")  # fmt: skip
    p.add_argument("-o", "--output", default=None, help="profile JSON to write (arrays go next to it as .npz)")
    p.add_argument("--html", default=None, help="write a self-contained HTML report here")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed row")
    p.add_argument("--exact-cap", type=int, default=2_000_000, help="distinct IDs per feature counted exactly")
    p.add_argument("--cardinality", action="append", default=[], metavar="FIELD=N",
                   help="with --scale-to: FIELD is known to have N values at most (repeatable)")
    g = p.add_argument_group("column layout (csv, avazu, parquet, libsvm)")
    g.add_argument("--label", default=None, help="label column (default: label/click if present)")
    g.add_argument("--dense", default=None, help="comma-separated dense columns")
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
    p.set_defaults(func=run)


def _count(text: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a row count, got {text!r}") from None
    if v <= 0 or v != int(v):
        raise argparse.ArgumentTypeError(f"expected a positive whole row count, got {text!r}")
    return int(v)


def run(args) -> int:
    import json
    import sys

    from picasso.progress import Progress
    from traces.profile import check_output, profile_file

    if args.batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    caps = _cardinalities(args.cardinality)
    if caps and not args.scale_to:
        raise ValueError("--cardinality caps an extrapolation: give --scale-to ROWS with it")
    for out in (args.output, args.html):
        if out:
            check_output(out)  # before the read, not after it
    options = {
        "label": args.label, "dense": args.dense, "categorical": args.categorical, "skip": args.skip,
        "sep": args.sep, "header": args.header, "multi_sep": args.multi_sep, "multi": args.multi,
        "field_map": args.field_map, "dense_fields": args.dense_fields,
    }  # fmt: skip
    bar = Progress("analyze")
    try:
        prof = profile_file(args.data, args.format, batch_size=args.batch_size, strict=args.strict,
                            progress=bar, exact_cap=args.exact_cap, **options)  # fmt: skip
    finally:
        bar.close()
    measured = prof
    if args.scale_to:
        prof = prof.scale_to(args.scale_to, cardinality=caps)
    if args.output:
        prof.save(args.output)
    if args.html:
        write_html(args.html, prof, measured=measured if args.scale_to else None)
    meta = measured.meta
    if args.json:
        print(json.dumps(prof.table()))
    else:
        print(summary_table(prof))
        print(f"{meta['rows_ok']:,} rows read in {meta['seconds']:.2f} s"
              + (f", {meta['rows_bad']:,} malformed rows skipped (first at lines "
                 f"{', '.join(map(str, meta['first_bad_lines'][:5]))})" if meta["rows_bad"] else "")
              + (f"; extrapolated to {args.scale_to:,} rows" if args.scale_to else ""))  # fmt: skip
        if args.output:
            print(f"profile written to {args.output}")
        if args.html:
            print(f"report written to {args.html}")
    if meta["rows_bad"]:
        print(f"warning: {meta['rows_bad']:,} malformed rows skipped; first: {meta['first_bad_reasons'][0]}",
              file=sys.stderr)
    for w in prof.meta.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    if not args.output:
        print("note: no profile written (give -o FILE to save one for `picasso plan --profile`)", file=sys.stderr)
    return 0


def _cardinalities(items: list[str]) -> dict[str, int]:
    out = {}
    for text in items:
        name, sep, value = text.partition("=")
        try:
            n = int(value)
        except ValueError:
            n = 0
        if not sep or not name.strip() or n < 1:
            raise ValueError(f"--cardinality {text!r}: expected FIELD=N with N a positive whole number")
        out[name.strip()] = n
    return out


def summary_table(prof) -> str:
    head = f"{'feature':<10} {'distinct':>12} {'missing':>8} {'pooling':>8} {'top1':>7} {'top1%':>7} {'top10%':>7}  count"
    lines = [head, "-" * len(head)]
    for f in prof.features.values():
        kind = "exact" if f.exact else ("extrapolated" if f.extrapolated_to else "sketch")
        top1 = f.coverage_at(1) if f.distinct else 0.0
        lines.append(
            f"{f.name:<10} {f.distinct:>12,} {f.missing_rate:>8.1%} {f.pooling:>8.3f} {top1:>7.1%} "
            f"{f.coverage(0.01):>7.1%} {f.coverage(0.1):>7.1%}  {kind}"
        )
    return "\n".join(lines)


def _cover(f, x: float) -> str:
    from traces.coverage import top_ids

    return f"{f.coverage(x):.1%} ({top_ids(x, f.distinct):,})"


def write_html(path: str, prof, measured=None) -> None:
    """Self-contained plotly report: coverage curves, batch presence, top-k coverage table."""
    import os

    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from foundation.files import atomic_write_text

    feats = list(prof.features.values())
    fig = make_subplots(
        rows=3, cols=1, row_heights=[0.38, 0.30, 0.32], vertical_spacing=0.08,
        specs=[[{"type": "xy"}], [{"type": "xy"}], [{"type": "table"}]],
        subplot_titles=(
            "Coverage: share of accesses served by the top x of distinct IDs",
            "Batch presence: IDs by the number of sampled batches they appear in"
            + (f" (batch {measured.batch_size if measured else prof.batch_size})"),
            "Top-k coverage",
        ),
    )  # fmt: skip
    for f in feats:
        x, y = f.coverage_curve()
        fig.add_trace(go.Scatter(x=x, y=y, name=f.name, mode="lines", legendgroup=f.name), row=1, col=1)
        if measured is not None and f.name in measured.features:
            mx, my = measured.features[f.name].coverage_curve()
            fig.add_trace(go.Scatter(x=mx, y=my, name=f"{f.name} (sample)", mode="lines", legendgroup=f.name,
                                     line={"dash": "dot"}, visible="legendonly"), row=1, col=1)  # fmt: skip
    src = measured if measured is not None else prof
    for f in src.features.values():
        h = np.asarray(f.presence_hist)
        if f.presence_batches and h.sum():
            j = np.arange(len(h))
            fig.add_trace(go.Bar(x=j[1:] / f.presence_batches, y=h[1:], name=f"{f.name} presence",
                                 legendgroup=f.name, showlegend=False), row=2, col=1)  # fmt: skip
    ks = (10, 100, 1000, 10000, 100000)
    header = ["feature", "distinct", "pooling", "top 0.1% (IDs)", "top 1% (IDs)", "top 10% (IDs)", *[f"top {k:,}" for k in ks], "kind"]
    cells = [
        [f.name for f in feats],
        [f"{f.distinct:,}" for f in feats],
        [f"{f.pooling:.3f}" for f in feats],
        *[[_cover(f, x) for f in feats] for x in (0.001, 0.01, 0.1)],
        *[[f"{f.coverage_at(k):.1%}" for f in feats] for k in ks],
        ["exact" if f.exact else ("extrapolated" if f.extrapolated_to else "sketch") for f in feats],
    ]
    fig.add_trace(go.Table(header={"values": header}, cells={"values": cells}), row=3, col=1)
    fig.update_xaxes(type="log", title_text="top fraction of distinct IDs", row=1, col=1)
    fig.update_yaxes(title_text="coverage", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title_text="fraction of sampled batches an ID appears in", row=2, col=1)
    fig.update_yaxes(type="log", title_text="IDs", row=2, col=1)
    title = f"picasso analyze: {os.path.basename(prof.source)}, {prof.rows:,} rows"
    if measured is not None:
        title += f" (extrapolated from {measured.rows:,})"
    fig.update_layout(title=title, height=1500, barmode="overlay", template="plotly_white")
    atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))
