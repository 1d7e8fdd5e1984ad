"""The driver's side of TorchRec baselines: its venv, the rows it trains on, one DMP run.

Used by bench_vs_torchrec.py (DLRM, one-hot) and bench_pooled_gloo.py (DLRM-DCNv2,
multi-hot). TorchRec runs only inside its own virtual environment (bench/torchrec_worker.py
under TorchRec's torch.distributed.run); this module imports nothing of TorchRec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIP_STEPS = (
    ["torch==2.13.0", "fbgemm-gpu-cpu==1.8.0"],
    ["--no-deps", "torchrec==1.8.0"],
    ["tensordict", "torchmetrics==1.0.3", "tqdm", "pyre-extensions", "iopath"],
)


def default_venv() -> Path:
    return Path(os.environ.get("PICASSO_TORCHREC_VENV", Path.home() / ".cache" / "picasso" / "torchrec-venv"))


def ensure_venv(venv: Path) -> Path:
    """The venv's python, after installing TorchRec there if it cannot import it."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import torchrec"], capture_output=True).returncode == 0:
        return py
    print(f"installing TorchRec into {venv} ...", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for args in PIP_STEPS:
        subprocess.run([str(py), "-m", "pip", "install", *args], check=True)
    return py


def torchrec_rows(data: str, fmt: str, model, out: Path, rows: int | None = None, seed: int = 0) -> int:
    """The rows picasso's reader makes of `data` (IDs % num_rows, the dense transform, bags
    kept) as an .npz for the TorchRec worker: dense [N,13], labels [N], lengths [N,F] and per
    table its IDs `v<i>` in row order. A converted dataset (fmt "dataset") is read in epoch
    0's order for `seed` (the order `picasso run` reads it in, with the plan's seed); a text
    file in file order. Returns N."""
    import numpy as np

    from executor.data.batches import RawBatch, feature_map, reader_chunks, to_batch

    if fmt == "dataset":
        from traces.dataset import Dataset, EpochOrder

        ds = Dataset(data)
        n = ds.rows if rows is None else min(rows, ds.rows)
        r = ds.read(EpochOrder(ds.rows, seed).segments(0, 0, n))
        raw = RawBatch(labels=r.labels, dense=r.dense, sparse=r.sparse, dense_ready=ds.dense_transform == "log1p")
    else:
        chunks, got = [], 0
        for c in reader_chunks(data, fmt):
            chunks.append(c)
            got += len(c.labels)
            if rows is not None and got >= rows:
                break
        raw = RawBatch.concat(chunks)
    b = to_batch(raw, model, feature_map(model, raw.sparse))
    keep = len(b.labels) if rows is None else min(rows, len(b.labels))
    arrays = {"dense": b.dense.numpy()[:keep], "labels": b.labels.numpy()[:keep]}
    lengths = []
    for i, t in enumerate(model.table_names):
        ids, offsets = (x.numpy() for x in b.sparse[t])
        lengths.append(np.diff(offsets)[:keep])
        arrays[f"v{i}"] = ids[: offsets[keep]]
    arrays["lengths"] = np.stack(lengths, axis=1).astype(np.int32)
    np.savez(out, **arrays)
    return keep


def run_env(ranks: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // ranks)), "OMP_WAIT_POLICY": "PASSIVE"}


def run_dmp(py: Path, npz: Path, model, ranks: int, batch: int, steps: int, warmup: int, sparse_lr: float,
            dense_lr: float, eps: float, sparse_optimizer: str = "rowwise_adagrad",
            lock: list[str] | None = None, tries: int = 2) -> dict:
    """One TorchRec DistributedModelParallel run (its own planner) of `model` on `ranks` gloo
    ranks; the worker's JSON line (samples_per_s, sharding_types, last_loss) with the causes of
    the failed tries before it (`failed_tries`)."""
    from executor.process.spawn import free_port

    cmd = [str(ROOT / "bench" / "torchrec_worker.py"), "--data", str(npz),
           "--rows", ",".join(str(t.num_rows) for t in model.tables), "--dim", str(model.tables[0].dim),
           "--batch", str(batch), "--bottom", ",".join(map(str, model.bottom_mlp)),
           "--top", ",".join(map(str, model.top_mlp)), "--lr", str(sparse_lr), "--dense-lr", str(dense_lr),
           "--eps", str(eps), "--sparse-optimizer", sparse_optimizer, "--steps", str(steps + warmup),
           "--warmup", str(warmup)]
    if model.interaction == "cross":
        cmd += ["--cross-layers", str(int(model.extra.get("cross_layers", 2))),
                "--cross-rank", str(int(model.extra.get("cross_rank", 0)))]
    failures: list[str] = []
    for _ in range(tries):  # a DMP run now and then fails (twice in ~20 bench runs here): once more
        torchrun = [str(py), "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                    "--master-port", str(free_port())]  # a fresh port per try
        p = subprocess.run([*(lock or []), *torchrun, *cmd], capture_output=True, text=True, env=run_env(ranks))
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode == 0 and lines:
            return {**json.loads(lines[-1]), "failed_tries": failures}
        failures.append(_cause(p.stderr))
    raise SystemExit(f"TorchRec run failed {tries} times: {failures[-1]}")


def _cause(stderr: str) -> str:
    """The line that says why a torchrun job failed (its summary ends in a row of '=')."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (named or lines or ["no output"])[-1][:300]
