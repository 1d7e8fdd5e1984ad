"""A batch bound for the GPU travels as one buffer per dtype (executor.data.batches.Packed):
two host-to-device copies a step instead of one per tensor, and the captured graph's static
buffers are filled by one multi-tensor copy and one multi-tensor fill."""

from __future__ import annotations

import numpy as np
import torch

from executor.data.batches import Batch, RawBatch, to_batch
from executor.run.cuda_graph import _copy_into, _static_copy
from planner.model_spec import ModelSpec, TableSpec

MODEL = ModelSpec("m", "dlrm", 3, (TableSpec("C1", 50, 4), TableSpec("C2", 70, 4), TableSpec("C3", 9, 4)),
                  bottom_mlp=(4,), top_mlp=(1,))


def batch(n: int, seed: int, longest: int = 3) -> Batch:
    rng = np.random.default_rng(seed)
    sparse = {}
    for t in ("C1", "C2", "C3"):
        lens = rng.integers(0, longest + 1, n)
        off = np.concatenate([[0], np.cumsum(lens)])
        sparse[t] = (rng.integers(0, 1000, off[-1]), off)
    raw = RawBatch(rng.random(n).astype(np.float32), rng.random((n, 3)).astype(np.float32), sparse, True)
    return to_batch(raw, MODEL, {t: t for t in sparse})


def test_packed_copy_is_one_buffer_per_dtype_with_the_same_values():
    b = batch(7, 0)
    p = b.packed_copy()
    assert set(p.packed.buffers) == {torch.float32, torch.int64}
    for got, want in zip(p.tensors(), b.tensors()):
        assert torch.equal(got, want) and got.dtype == want.dtype
        assert got.untyped_storage().data_ptr() == p.packed.buffers[got.dtype].untyped_storage().data_ptr()
    assert p.sparse.keys() == b.sparse.keys() and {t: h.tolist() for t, h in p._host_offsets().items()} == \
        {t: h.tolist() for t, h in b._host_offsets().items()}


def test_a_packed_batch_goes_to_the_device_in_one_copy_per_buffer(monkeypatch):
    """The meta device stands for CUDA: each buffer is copied once, the tensors are its views."""
    p = batch(9, 1).packed_copy()
    calls = []
    real = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    on = p.to(torch.device("meta"))
    assert len(calls) == 2
    assert [t.shape for t in on.tensors()] == [t.shape for t in p.tensors()]
    assert all(t.device.type == "meta" for t in on.tensors())


def test_static_buffers_are_filled_without_a_copy_per_tensor(monkeypatch):
    first, nxt = batch(8, 2, longest=1), batch(8, 3, longest=1)  # one-hot with missing values: fits the buffers
    static = _static_copy(first, pad=True)
    copies = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, *a, **k: copies.append(1) or real(self, *a, **k))
    monkeypatch.setattr(torch.Tensor, "zero_", lambda self: copies.append(1) or self.fill_(0))
    _copy_into(static, nxt)
    monkeypatch.undo()
    assert not copies
    assert torch.equal(static.labels, nxt.labels) and torch.equal(static.dense, nxt.dense)
    for t, (rows, off) in nxt.sparse.items():
        buf = static.sparse[t][0]
        assert torch.equal(buf[: len(rows)], rows) and (buf[len(rows):] == 0).all()
        assert torch.equal(static.sparse[t][1], off)
