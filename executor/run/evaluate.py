"""Forward-only evaluation on held-out data: AUC and logloss, exact across ranks.

Every rank scores its share of each evaluation batch with the trainer's packs (their ID
exchanges included) and dense model, under no_grad and without touching any gradient or
optimizer state. The scores and labels of all ranks are gathered and the AUC computed from
one sort (ties share their mean rank), so it equals a single-process sort-based AUC; memory is
8 bytes per held-out row on each rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from executor.data.batches import (
    BadRows,
    Batch,
    DataError,
    RawBatch,
    feature_map,
    reader_chunks,
    rebatch,
    to_batch,
)
from executor.dense.precision import dense_precision
from executor.run.reference import RecModel
from executor.step.trainer import Trainer, dense_step_inputs
from planner.model_spec import ModelSpec
from traces.dataset import Dataset, is_dataset


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U); tied scores get their mean rank."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    pos, n = int(y.sum()), len(y)
    if pos == 0 or pos == n:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    first = np.concatenate([[True], ss[1:] != ss[:-1]])
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.concatenate([starts[1:], [n]])
    mean_rank = (starts + ends + 1) / 2.0  # 1-based ranks starts+1 .. ends, averaged
    rank_sum = mean_rank[group][y[order]].sum()
    return float((rank_sum - pos * (pos + 1) / 2.0) / (pos * (n - pos)))


def logloss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy of the logits, in float64 (stable for large |logit|)."""
    x = np.asarray(logits, dtype=np.float64)
    y = (np.asarray(labels) > 0.5).astype(np.float64)
    return float(np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))))


@torch.no_grad()
def forward_logits(trainer: Trainer, local: Batch) -> torch.Tensor:
    """Logits of this rank's rows (collective: every rank calls it once per evaluation batch)."""
    local = local.to(trainer.dev)
    lks = []
    for p in trainer.packs:
        idx, offs = p.pack_inputs(local.sparse)
        lk = p.dedup(idx, offs)
        p.prepare(lk)
        lks.append(lk)
    if trainer.comm.world > 1:
        trainer._exchange_sizes([lks], count=False)  # not training's exchange counts
    for p, lk in zip(trainer.packs, lks):
        p.hot_gather(lk)
        if not p.local_only:
            p.send_ids(lk, async_op=False)
    for p, lk in zip(trainer.packs, lks):  # after every ID exchange: fused groups launch on the last
        if not p.local_only:
            p.gather(lk, async_op=False)
    embs: dict = {}
    seqs: dict = {}
    for p, lk in zip(trainer.packs, lks):
        out = p.pool(lk, p.assemble(lk))
        dense_step_inputs(trainer.plan.model, p.layout.tables, out, local, embs, seqs)
    with trainer.precision.autocast(trainer.dev):
        logit = trainer.dense(local.dense, embs, seqs)
    return logit.float()


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's rows of an n-row evaluation batch: contiguous, sizes differing by one at most."""
    return rank * n // world, (rank + 1) * n // world


def global_ranges(rows: int, size: int, world: int) -> list[tuple[int, int]]:
    """Evaluation batches over `rows` rows; a last batch smaller than the world joins the one before,
    so every rank has rows in every batch."""
    if rows < world:
        raise DataError(f"the evaluation data has {rows} rows, fewer than the {world} ranks")
    out = [(a, min(a + size, rows)) for a in range(0, rows, size)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < world:
        out[-2:] = [(out[-2][0], rows)]
    return out


def _text_batches(path: str, fmt: str, size: int, world: int, bad: BadRows) -> Iterator[RawBatch]:
    """Whole evaluation batches of a text log, with the same tail rule as `global_ranges`:
    a tail shorter than the world joins the batch before it."""
    ready: RawBatch | None = None
    for b in rebatch(reader_chunks(path, fmt, bad=bad), size, keep_tail=True):
        if ready is not None:
            if len(b) < world:  # only the tail can be this short
                b = RawBatch.concat([ready, b])
            else:
                yield ready
        ready = b
    if ready is None:
        raise DataError(f"{path}: no evaluation rows")
    if len(ready) < world:
        raise DataError(f"{path}: {len(ready)} evaluation rows, fewer than the {world} ranks")
    yield ready


class Evaluator:
    """Scores held-out data with a trainer; `run(step)` is collective and returns the metrics."""

    def __init__(self, trainer: Trainer, data: str, fmt: str, batch: int) -> None:
        self.trainer, self.data, self.fmt, self.batch = trainer, data, fmt, max(1, batch)
        self.dataset = Dataset(data) if is_dataset(data) else None
        self.history: list[dict] = []
        self.bad = BadRows()

    def run(self, step: int) -> dict:
        t0 = time.perf_counter()
        self.bad = BadRows()
        rank, world = self.trainer.comm.rank, self.trainer.comm.world
        raw = local_batches(self.data, self.fmt, self.batch, rank, world, self.dataset, self.bad)
        mine = _scored(raw, self.trainer.plan.model, lambda b: forward_logits(self.trainer, b))
        if self.trainer.comm.world > 1:
            import torch.distributed as dist

            everyone: list = [None] * self.trainer.comm.world
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        x = np.concatenate([e[0] for e in everyone])
        y = np.concatenate([e[1] for e in everyone])
        res = {"step": step, **metrics(x, y), "seconds": time.perf_counter() - t0}
        if self.bad.count:
            res["malformed_rows"] = self.bad.count
        self.history.append(res)
        return res


def metrics(logits: np.ndarray, labels: np.ndarray) -> dict:
    """Rows, AUC, logloss and positive rate of scored rows."""
    return {"rows": len(labels), "auc": auc(logits, labels), "logloss": logloss(logits, labels),
            "positive_rate": float((labels > 0.5).mean())}


def local_batches(data: str, fmt: str, size: int, rank: int, world: int, dataset: Dataset | None,
                  bad: BadRows) -> Iterator[RawBatch]:
    """This rank's share of each evaluation batch of `data` (a converted Dataset when `dataset`)."""
    if dataset is not None:
        for a, b in global_ranges(dataset.rows, size, world):
            lo, hi = share(b - a, rank, world)
            r = dataset.read_range(a + lo, a + hi)
            yield RawBatch(r.labels, r.dense, r.sparse, dataset.dense_transform == "log1p")
        return
    for gb in _text_batches(data, fmt, size, world, bad):
        yield gb.slice(*share(len(gb), rank, world))


def _scored(raw: Iterator[RawBatch], model: ModelSpec, logits_of: Callable[[Batch], torch.Tensor]
            ) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels of every row of `raw`, the data's features mapped to the model's tables."""
    fmap: dict[str, str] = {}
    logits, labels = [], []
    for r in raw:
        if not fmap:
            fmap = feature_map(model, r.sparse)
        b = to_batch(r, model, fmap)
        logits.append(logits_of(b).cpu().numpy())
        labels.append(b.labels.numpy())
    return np.concatenate(logits), np.concatenate(labels)


@torch.no_grad()
def score(net: RecModel, data: str, fmt: str = "criteo", batch: int = 4096) -> dict:
    """AUC and logloss of a plain-PyTorch model (executor.run.model_file.load) on `data`, in one
    process and without a plan; the same batches, precision and metrics as a run's evaluation."""
    t0 = time.perf_counter()
    model = net.spec
    precision = dense_precision(model.dense_precision, torch.device("cpu"))
    bad = BadRows()
    dataset = Dataset(data) if is_dataset(data) else None

    def logits_of(b: Batch) -> torch.Tensor:
        embs, seqs = net.pooled(b)  # the tables in fp32, the dense layers at the run's precision
        with precision.autocast(torch.device("cpu")):
            return net.dense(b.dense, embs, seqs).float()

    x, y = _scored(local_batches(data, fmt, max(1, batch), 0, 1, dataset, bad), model, logits_of)
    res = {**metrics(x, y), "seconds": time.perf_counter() - t0}
    if bad.count:
        res["malformed_rows"] = bad.count
    return res
