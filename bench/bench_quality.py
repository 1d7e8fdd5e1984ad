"""Model quality on the real Criteo sample: DLRM under several plans vs logistic regression.

Data: ../shared/data/criteo_kaggle_head8k (train_split 7,200 rows, dev_split 409, test_split 391;
the first 8,000 rows of Kaggle's train.txt). DLRM (dlrm-criteo-kaggle, tables capped at 20,000
rows, the planner's optimizer: SGD lr 0.05) trains EPOCHS epochs on the converted train split
through `picasso run` under the single-process reference plan (1 rank), the planner's plan, `naive`
and a plan with hot rows and 2 micro-batches (2 gloo ranks each); test AUC after every epoch.

The baseline is logistic regression on the same inputs (log1p dense features, one weight per
categorical row with the same ID -> row mapping), trained with Adam over the same epochs; its
learning rate and epoch are chosen on dev AUC, and the test AUC of that choice is reported.

    python bench/bench_quality.py     ->  bench/results/quality/<machine>.json
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from planner.sharding import Sharding

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from executor.data.batches import RawBatch, chunk_from_reader, feature_map, to_batch  # noqa: E402
from executor.run.evaluate import auc, logloss  # noqa: E402
from picasso.cli import main as picasso  # noqa: E402
from planner.plan import PackPlan, Plan  # noqa: E402
from traces.readers import open_reader  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "criteo_kaggle_head8k"
EPOCHS, BATCH = 3, 128


def cli(*argv) -> dict | None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = picasso([*map(str, argv)])
    if rc != 0:
        raise SystemExit(f"picasso {argv[0]} failed ({rc})")
    text = out.getvalue()
    return json.loads(text[text.index("{"):]) if "--json" in argv else None


def load(path: Path, model) -> tuple:
    raw = RawBatch.concat([chunk_from_reader(c) for c in open_reader(str(path), "criteo")])
    b = to_batch(raw, model, feature_map(model, raw.sparse))
    return b


class LogReg(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.names = [t.name for t in model.tables]
        self.w = torch.nn.ModuleDict({t.name: torch.nn.EmbeddingBag(t.num_rows, 1, mode="sum") for t in model.tables})
        for e in self.w.values():
            torch.nn.init.zeros_(e.weight)
        self.dense = torch.nn.Linear(model.num_dense, 1)

    def forward(self, b, lo: int, hi: int) -> torch.Tensor:
        s = b.slice(lo, hi)
        out = self.dense(s.dense).squeeze(1)
        for n in self.names:
            rows, off = s.sparse[n]
            out = out + self.w[n](rows, off[:-1]).squeeze(1)
        return out


def logistic_regression(model, train, dev, test) -> dict:
    best = None
    tried = []
    for lr in (0.003, 0.01, 0.03):
        torch.manual_seed(0)
        lrm = LogReg(model)
        opt = torch.optim.Adam(lrm.parameters(), lr=lr)
        g = torch.Generator().manual_seed(0)
        n = len(train)
        for epoch in range(1, EPOCHS + 1):
            perm = torch.randperm(n // (2 * BATCH), generator=g)
            for k in perm.tolist():
                lo = k * 2 * BATCH
                loss = torch.nn.functional.binary_cross_entropy_with_logits(lrm(train, lo, lo + 2 * BATCH),
                                                                            train.labels[lo:lo + 2 * BATCH])
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():
                d, t = lrm(dev, 0, len(dev)).numpy(), lrm(test, 0, len(test)).numpy()
            row = {"lr": lr, "epoch": epoch, "dev_auc": auc(d, dev.labels.numpy()),
                   "test_auc": auc(t, test.labels.numpy()), "test_logloss": logloss(t, test.labels.numpy())}
            tried.append(row)
            if best is None or row["dev_auc"] > best["dev_auc"]:
                best = row
    return {"chosen_on_dev": best, "tried": tried}


def main() -> None:
    if not DATA.is_dir():
        raise SystemExit(f"{DATA}: the real Criteo sample is not here")
    tmp = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    train, test = DATA / "train_split.tsv", DATA / "test_split.tsv"
    cli("analyze", train, "--format", "criteo", "-o", tmp / "profile.json", "--batch-size", 2 * BATCH)
    common = ["--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--set", "gpus_per_node=2", "--profile",
              tmp / "profile.json", "--row-cap", "20000", "--batch-size", BATCH]
    cli("plan", *common, "--time-budget", "5", "-o", tmp / "planned.json")
    cli("plan", *common, "--baseline", "naive", "-o", tmp / "naive.json")
    cli("convert", train, "--format", "criteo", "-o", tmp / "ds")
    planned = Plan.load(tmp / "planned.json")
    m, t = planned.model, planned.model.table_names
    big = [x.name for x in sorted(m.tables, key=lambda x: -x.num_rows)[:2]]
    Plan(m, 2, BATCH, [PackPlan("pack0", t[:13], Sharding.ROW_WISE), PackPlan("pack1", t[13:], Sharding.COLUMN_WISE)],
         hot_rows={n: 256 for n in big}, micro_batches=2, kernel_interleaving=True, seed=planned.seed,
         optimizer=planned.optimizer).save(tmp / "hot.json", hot_ids={n: np.arange(256) for n in big})
    Plan(m, 1, 2 * BATCH, [PackPlan("pack0", t, Sharding.ROW_WISE)], seed=planned.seed,
         optimizer=planned.optimizer).save(tmp / "reference.json", hot_ids={})
    runs = {}
    for name in ("reference", "planned", "naive", "hot"):
        t0 = time.perf_counter()
        res = cli("run", tmp / f"{name}.json", "--data", tmp / "ds", "--epochs", EPOCHS, "--eval-data", test,
                  "--eval-every", 7200 // (2 * BATCH), "--json")
        runs[name] = {"world_size": res["world_size"], "seconds": time.perf_counter() - t0,
                      "eval": [{k: e[k] for k in ("step", "auc", "logloss")} for e in res["eval"]]}
        print(f"{name:10} " + "  ".join(f"step {e['step']}: AUC {e['auc']:.5f} logloss {e['logloss']:.5f}"
                                       for e in res["eval"]))
    ref = runs["reference"]["eval"]
    for r in runs.values():
        r["max_auc_diff_vs_reference"] = max(abs(a["auc"] - b["auc"]) for a, b in zip(r["eval"], ref))
        r["max_logloss_diff_vs_reference"] = max(abs(a["logloss"] - b["logloss"]) for a, b in zip(r["eval"], ref))
    lr = logistic_regression(m, load(train, m), load(DATA / "dev_split.tsv", m), load(test, m))
    c = lr["chosen_on_dev"]
    print(f"logistic regression (lr {c['lr']}, epoch {c['epoch']} chosen on dev AUC {c['dev_auc']:.5f}): "
          f"test AUC {c['test_auc']:.5f} logloss {c['test_logloss']:.5f}")
    out = {
        "data": str(DATA.name), "rows": {"train": 7200, "dev": 409, "test": 391}, "epochs": EPOCHS,
        "global_batch": 2 * BATCH, "dlrm": runs, "logistic_regression": lr,
        "note": "test AUC after each epoch; DLRM's hyper-parameters are the planner's (SGD 0.05), not tuned; "
                "the baseline's learning rate and epoch are chosen on dev. 391 test rows: one flipped pair of "
                "scores moves the AUC by about 4e-5.",
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch.__version__},
    }
    dest = results_path("quality")
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {dest}")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
