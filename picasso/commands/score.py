"""`picasso score`: AUC and logloss of an exported model file on new data, in one process, without a plan."""

from __future__ import annotations

import argparse

from foundation.flags import BATCH


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("score", parents=[common], help="evaluate an exported model (AUC, logloss) on new data")
    p.add_argument("model", help="model file from `picasso export-model`")
    p.add_argument("--data", required=True, help="labelled click-log file or glob, or a folder from `picasso convert`")
    p.add_argument("--format", default="criteo", help="data format: criteo, avazu, csv, parquet, libsvm")
    p.add_argument("--batch-size", type=BATCH, default=4096, help="rows scored at a time")
    p.set_defaults(func=run)


def execute(args: argparse.Namespace) -> dict:
    from executor.data.inputs import check_input
    from executor.run.evaluate import score
    from executor.run.model_file import load
    from foundation.files import regular_file

    regular_file(args.model, "model file")
    net = load(args.model)
    check_input(net.spec, args.data, args.format, "data file")
    return score(net, args.data, args.format, args.batch_size)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    res = execute(args)
    if args.json:
        print(json.dumps({"model": args.model, "data": args.data, **res}))
        return 0
    auc = "undefined (one class only)" if res["auc"] != res["auc"] else f"{res['auc']:.4f}"
    print(f"{args.model} on {args.data}: AUC {auc}, logloss {res['logloss']:.4f} "
          f"({res['rows']:,} rows, {res['positive_rate']:.1%} positive, {res['seconds']:.1f} s)")
    if res.get("malformed_rows"):
        print(f"warning: {res['malformed_rows']:,} malformed rows skipped", file=sys.stderr)
    return 0
