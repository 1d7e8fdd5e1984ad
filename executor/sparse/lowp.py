"""16-bit embedding tables: storage dtype, and updates by deterministic stochastic rounding.

A table declared fp16/bf16 is stored in that dtype (the bytes per row the planner costs,
`TableSpec.bytes_per_row`); lookups are pooled in fp32 and gradients stay fp32.

Update choice: stochastic rounding, not fp32 master rows. A master copy would keep 4 bytes
per element next to the 2-byte table (6 bytes: more than an fp32 table), which defeats the
point of declaring the table 16-bit. Rounding to nearest would drop every update smaller
than half an ulp (most sparse updates of a large table); rounding up with probability
(x - lo) / (hi - lo) keeps the update unbiased in expectation.

The random draw of an element is a hash of (plan seed, step, model-wide row, column), not
a generator's stream, so the executor (rows spread over ranks, packs, hot caches in any
order) and the single-process reference round every element the same way: they differ
only where their fp32 results differ by rounding and straddle a rounding threshold.
"""

from __future__ import annotations

import torch

from planner.model_spec import DTYPES, ModelSpec

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
assert all(torch.empty(0, dtype=d).element_size() == DTYPES[k] for k, d in TORCH_DTYPES.items())
_M32 = 0xFFFFFFFF


def storage_dtype(name: str) -> torch.dtype:
    """The torch dtype of a table declared `name` (planner.model_spec.DTYPES)."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"table dtype {name!r} is not one the executor stores ({sorted(TORCH_DTYPES)})") from None


def is_low(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


# --verify tolerance (max relative difference to the reference) of a plan with 16-bit tables,
# over 20 steps: one stochastic-rounding draw that lands differently (the fp32 update differs
# by rounding and straddles the threshold) moves an element by one ulp, 2**-8 = 3.9e-3
# relative for bf16 (2**-11 for fp16); 1e-2 allows two such flips on a table's largest
# element. fp32 plans keep the equivalence suite's 1e-5.
VERIFY_TOL_FP32 = 1e-5
VERIFY_TOL_16 = 1e-2


def verify_tolerance(model: ModelSpec) -> float:
    """The documented --verify tolerance of a model's plans (tests/test_executor_features.py)."""
    return VERIFY_TOL_16 if any(t.dtype != "fp32" for t in model.tables) else VERIFY_TOL_FP32


def model_row_offsets(model: ModelSpec) -> dict[str, int]:
    """Each table's first row in one model-wide row numbering (the rounding hash's key)."""
    out, acc = {}, 0
    for t in model.tables:
        out[t.name] = acc
        acc += t.num_rows
    return out


def _noise(keys: torch.Tensor, cols: int, step: int, seed: int, col0: int = 0) -> torch.Tensor:
    """Uniform [0, 1) per (key row, column), from an integer hash (products stay below 2**63)."""
    col = torch.arange(col0, col0 + cols, device=keys.device, dtype=torch.int64)
    h = ((keys.unsqueeze(1) & _M32) * 0x9E3779B1 + col * 0x85EBCA77 + (step * 0xC2B2AE3D + seed * 0x27D4EB2F)) & _M32
    for _ in range(2):
        h = h ^ (h >> 16)
        h = (h * 0x45D9F3B) & _M32
    h = h ^ (h >> 16)
    return (h >> 8).to(torch.float32) / float(1 << 24)


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, keys: torch.Tensor, step: int, seed: int,
                     col0: int = 0) -> torch.Tensor:
    """fp32 `x` [n, D] to `dtype`: one of the two neighbours, up with probability of the distance."""
    y = x.to(dtype)
    yf = y.float()
    toward = torch.where(yf > x, -torch.inf, torch.inf).to(dtype)
    other = torch.nextafter(y, toward)
    gap = (other.float() - yf).abs()
    p = torch.where(gap > 0, (x - yf).abs() / gap, torch.zeros_like(x))
    return torch.where(_noise(keys, x.shape[1], step, seed, col0) < p, other, y)


def update_rows(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                keys: torch.Tensor, optimizer: str, lr: float, eps: float, step: int, seed: int,
                col0: int = 0) -> None:
    """The sparse update of a 16-bit table (duplicate rows summed first), without a size read.

    `keys` are the rows' model-wide numbers (the hash's key). `weight` holds columns
    [col0, col0 + width) of the rows (column-wise shards); `grads` are full rows (Adagrad's
    state needs them) or already those columns. Padding of the fixed-size dedup writes the
    first valid row's own new value again, so duplicates agree."""
    from executor.sparse import syncfree

    if rows.numel() == 0:
        return
    if weight.shape[1] == grads.shape[1] and syncfree.fuses_update(weight, low=True):
        # the Triton pass: sums, the optimizer and this rounding in one, each row by one program
        syncfree.update_low_rows(weight, state, rows, grads, keys, optimizer, lr, eps, step, seed, col0)
        return
    d, acc = syncfree.segment_sum(rows, grads)
    key_u = torch.zeros_like(keys).scatter_(0, d.inverse, keys)
    valid = torch.arange(len(rows), device=rows.device) < d.n_valid
    uniq = torch.where(valid, d.uniq, d.uniq[0])
    if optimizer == "rowwise_adagrad":
        state.index_add_(0, d.uniq, torch.where(valid, (acc * acc).mean(dim=1), 0.0))
    elif optimizer != "sgd":
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")
    width = weight.shape[1]
    if acc.shape[1] != width:
        acc = acc[:, col0 : col0 + width]
    if optimizer == "rowwise_adagrad":
        acc = syncfree.adagrad_step(acc, state.index_select(0, uniq), eps)
    new = stochastic_round(weight.index_select(0, uniq).float() - lr * acc, weight.dtype, key_u, step, seed, col0)
    new = torch.where(valid.unsqueeze(1), new, new[0])
    weight.index_put_((uniq,), new)


def update_dense(weight: torch.Tensor, state: torch.Tensor | None, grads: torch.Tensor, keys: torch.Tensor,
                 optimizer: str, lr: float, eps: float, step: int, seed: int) -> None:
    """Every row of a 16-bit cache by its gradient row (zero rows stay exactly as they are)."""
    from executor.sparse import syncfree

    g = grads.float()
    if optimizer == "rowwise_adagrad":
        state.add_((g * g).mean(dim=1))
        g = syncfree.adagrad_step(g, state, eps)
    elif optimizer != "sgd":
        raise ValueError(f"unknown sparse optimizer {optimizer!r}")
    weight.copy_(stochastic_round(weight.float() - lr * g, weight.dtype, keys, step, seed))


class RowKeys:
    """Model-wide row numbers of a pack's packed rows, from two small tensors (no per-row table)."""

    def __init__(self, model: ModelSpec, tables: list[str], table_offsets: dict[str, int],
                 device: torch.device) -> None:
        base = model_row_offsets(model)
        self.starts = torch.tensor([table_offsets[t] for t in tables], dtype=torch.int64, device=device)
        self.bases = torch.tensor([base[t] for t in tables], dtype=torch.int64, device=device)

    def __call__(self, packed: torch.Tensor) -> torch.Tensor:
        """The keys on `packed`'s device (a host-placed pack's rows are updated in host memory)."""
        p = packed.to(self.starts.device)
        t = torch.searchsorted(self.starts, p, right=True) - 1
        return (self.bases[t] + p - self.starts[t]).to(packed.device)
