"""`picasso analyze`: read a click log and write its AccessProfile (+ optional HTML report)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from foundation.flags import BATCH, ROWS, Whole
from picasso.layout_args import add_layout_args, layout_options

if TYPE_CHECKING:
    from traces.profile import AccessProfile

FORMATS = ("criteo", "avazu", "csv", "parquet", "libsvm")



def register(sub, common) -> None:
    p = sub.add_parser("analyze", parents=[common], help="profile the ID access frequencies of a click log")
    p.add_argument("data", help="click log (plain or gzip; Parquet for --format parquet)")
    p.add_argument("--format", required=True, choices=FORMATS, help="input format")
    p.add_argument("--batch-size", type=BATCH, default=4096, help="batch size for the batch-presence histogram")
    p.add_argument("--scale-to", type=ROWS, default=None, metavar="ROWS",
                   help="extrapolate the profile to this many rows (e.g. 45840617)")  # fmt: skip
    p.add_argument("-o", "--output", default=None, help="profile JSON to write (arrays go next to it as .npz)")
    p.add_argument("--html", default=None, help="write a self-contained HTML report here")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed row")
    p.add_argument("--exact-cap", type=Whole(1, 1 << 40, "a count of IDs"), default=2_000_000, help="distinct IDs per feature counted exactly")
    p.add_argument("--cardinality", action="append", default=[], metavar="FIELD=N",
                   help="with --scale-to: FIELD is known to have N values at most (repeatable)")
    add_layout_args(p, "column layout (csv, avazu, parquet, libsvm)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import sys

    prof, measured = execute(args)
    meta = measured.meta
    if args.json:
        print(json.dumps(prof.table()))
    else:
        print(_summary_table(prof))
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


def execute(args) -> tuple[AccessProfile, AccessProfile]:
    """Profile the log, extrapolate it if asked, and write what was asked: the work of
    `picasso analyze` and `picasso.analyze`. Returns (profile, the profile as measured)."""
    from foundation.progress import Progress
    from traces.extrapolate import scale_profile
    from traces.profile import check_output, profile_file

    caps = _cardinalities(args.cardinality)
    if caps and not args.scale_to:
        raise ValueError("--cardinality caps an extrapolation: give --scale-to ROWS with it")
    for out in (args.output, args.html):
        if out:
            check_output(out)  # before the read, not after it

    from foundation.outputs import Outputs

    Outputs().read("DATA", args.data).read("--field-map", args.field_map).file("-o", args.output, beside=(".npz",)).file(
        "--html", args.html).check()
    bar = Progress("analyze", unit="B")
    try:
        prof = profile_file(args.data, args.format, batch_size=args.batch_size, strict=args.strict,
                            progress=bar, exact_cap=args.exact_cap, **layout_options(args))  # fmt: skip
    finally:
        bar.close()
    measured = prof
    if args.scale_to:
        prof = scale_profile(prof, args.scale_to, cardinality=caps)
    if args.output:
        prof.save(args.output)
    if args.html:
        from planner.report import write_profile_html

        write_profile_html(args.html, prof, measured=measured if args.scale_to else None)
    return prof, measured


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


def _summary_table(prof) -> str:
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
