"""`picasso synth`: write a synthetic click log (the project's built-in data)."""

from __future__ import annotations

from foundation.flags import SEED, Real, Whole

SYNTH_ROWS = Whole(1, 1 << 36, "a row count")  # Criteo's terabyte log holds 4.4e9
ZIPF_S = Real(0.0, 10.0, lo_open=True, what="a Zipf exponent")
CLICK_RATE = Real(0.0, 1.0, what="a click rate")


def register(sub, common) -> None:
    p = sub.add_parser("synth", parents=[common], help="write a synthetic Criteo-format click log")
    p.add_argument("--preset", default="criteo-kaggle",
                   help="generator preset: criteo-kaggle (TSV), criteo-multihot (MLPerf DLRM-DCNv2 bags, Parquet)")
    p.add_argument("--rows", type=SYNTH_ROWS, required=True, help="number of rows, e.g. 1000000 or 1e6")
    p.add_argument("-o", "--output", required=True, help="output file (.gz compresses)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed (same seed, same file)")
    p.add_argument("--zipf-s", type=ZIPF_S, default=None, help="override every feature's Zipf exponent")
    p.add_argument("--click-rate", type=CLICK_RATE, default=None, help="override the click rate (default 0.25)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import time

    from foundation.progress import Progress
    from traces.synth import MULTIHOT_PRESETS, generate_criteo, generate_criteo_multihot

    params = {}
    if args.zipf_s is not None:
        params["zipf_s"] = args.zipf_s
    if args.click_rate is not None:
        params["click_rate"] = args.click_rate
    bar = Progress("synth", unit=" rows")
    t0 = time.perf_counter()
    if args.preset in MULTIHOT_PRESETS:
        info = generate_criteo_multihot(args.output, args.rows, seed=args.seed, progress=bar, **params)
    else:
        info = generate_criteo(args.output, args.rows, seed=args.seed, preset=args.preset, progress=bar, **params)
    bar.close()
    dt = time.perf_counter() - t0
    info["seconds"] = round(dt, 3)
    info["rows_per_second"] = round(args.rows / dt) if dt > 0 else None
    if args.json:
        print(json.dumps(info))
    else:
        print(f"wrote {args.rows:,} rows to {args.output} in {dt:.2f} s ({info['rows_per_second'] or 0:,} rows/s)")
    return 0
