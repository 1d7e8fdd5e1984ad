"""`picasso convert`: click logs -> a sharded binary dataset (traces/convert.py) for `picasso run --data DIR`."""

from __future__ import annotations

from foundation.flags import ROWS
from picasso.layout_args import add_layout_args, layout_options

FORMATS = ("criteo", "avazu", "csv", "tsv", "parquet", "libsvm", "libfm")



def register(sub, common) -> None:
    p = sub.add_parser("convert", parents=[common], help="convert click logs into a sharded binary dataset")
    p.add_argument("data", nargs="+", help="input files or globs (plain or gzip; e.g. 'day_*.gz')")
    p.add_argument("--format", required=True, choices=FORMATS, help="input format")
    p.add_argument("-o", "--output", required=True, help="dataset folder to create")
    p.add_argument("--dense", choices=("log1p", "none"), default="log1p",
                   help="dense features stored log(1 + max(x, 0)) as DLRM reads them (default), or as read")
    p.add_argument("--shard-rows", type=ROWS, default=1 << 20, help="rows per shard (default 1048576)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed row")
    p.add_argument("--force", action="store_true", help="replace an existing output folder (once the new one is whole)")
    add_layout_args(p, "column layout (as for `picasso analyze`)", dense_flag="--dense-columns")
    p.set_defaults(func=run)


def run(args) -> int:
    import glob
    import json
    import sys

    from foundation.outputs import Outputs
    from foundation.progress import Progress
    from traces.convert import convert

    Outputs().read("DATA", [f for d in args.data for f in (glob.glob(d) if glob.has_magic(d) else [d])]).read("--field-map", args.field_map).folder(
        "-o", args.output, "dataset", replaced=True).check()
    options = layout_options(args)
    bar = Progress("convert", unit="B")
    try:
        m = convert(args.data, args.format, args.output, dense_transform=args.dense, shard_rows=args.shard_rows,
                    strict=args.strict, force=args.force, progress=bar, **options)
    finally:
        bar.close()
    if args.json:
        print(json.dumps({k: v for k, v in m.items() if k != "shards"} | {"shards": len(m["shards"]),
                                                                          "output": args.output}))
    else:
        print(f"{m['rows']:,} rows ({len(m['features'])} categorical, {len(m['dense'])} dense, dense stored "
              f"{m['dense_transform']}) in {len(m['shards'])} shard(s), {m['seconds']:.2f} s -> {args.output}")
    if m["malformed_rows"]:
        first = next((s["first_malformed"][0] for s in m["sources"] if s["first_malformed"]), "")
        print(f"warning: {m['malformed_rows']:,} malformed rows skipped; first: {first}", file=sys.stderr)
    return 0
