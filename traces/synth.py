"""Synthetic click logs in Criteo layout: the project's built-in data.

Model (all parameters tunable through `generate_criteo(**params)`):
- Feature Cj draws 0-based popularity ranks r from a Zipf-Mandelbrot law over its
  cardinality V_j: P(rank r) proportional to (r + 1 + q)^-s_j, r = 0..V_j-1. Ranks
  below HEAD_EXACT use the exact discrete CDF; the tail above it uses the continuous
  inverse CDF of the same power law (relative error of a tail rank's probability < 1e-6).
- Exponents s_j default to the values that reproduce, at the full cardinality, the share
  of the most frequent value of each feature in the first 8,000 rows of Criteo Kaggle;
  missing rates are those of that sample.
- A rank becomes the 8-hex-char value `scramble(r, j)`: a fixed bijection of 32-bit
  integers (xor with a per-feature salt, then multiply/xor-shift rounds), so IDs look like
  hashes yet each feature's rank order is recoverable and distinct ranks never collide.
- I1..I13 are integers floor(expm1(N(mu, sigma))) with the sample's log-scale moments and
  missing rates (I2 also takes small negative values); labels are clicks with rate 0.25.
Same seed, same file: one numpy PCG64 stream per block of 65,536 rows, seeded by (seed, block).
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foundation.files import atomic_write, check_output_path
from traces.errors import TraceError

# Public Criteo Kaggle (Display Advertising Challenge) cardinalities of C1..C26.
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
CRITEO_KAGGLE_ROWS = 45_840_617
# Zipf exponents fitted to the top-1 share of each feature in the real 8k-row sample.
CRITEO_KAGGLE_ZIPF_S = (
    1.72, 0.95, 0.98, 1.02, 2.19, 1.70, 0.62, 1.96, 3.28, 1.32, 0.67, 0.98, 0.65,
    1.27, 0.73, 0.97, 1.29, 0.84, 1.97, 0.49, 0.97, 1.67, 1.43, 1.01, 1.33, 1.01,
)  # fmt: skip
CRITEO_KAGGLE_MISSING = (
    0.0, 0.0, 0.033, 0.033, 0.0, 0.133, 0.0, 0.0, 0.0, 0.0, 0.0, 0.033, 0.0,
    0.0, 0.0, 0.033, 0.0, 0.0, 0.453, 0.453, 0.033, 0.819, 0.0, 0.033, 0.453, 0.453,
)  # fmt: skip
# I1..I13: (missing rate, mu, sigma) of log1p(value) in the real sample.
CRITEO_KAGGLE_DENSE = (
    (0.451, 0.78, 0.97), (0.0, 2.11, 2.13), (0.201, 2.25, 1.29), (0.202, 1.73, 0.96),
    (0.05, 7.28, 2.87), (0.252, 3.61, 1.80), (0.048, 1.52, 1.34), (0.001, 2.05, 1.18),
    (0.048, 3.61, 1.69), (0.451, 0.37, 0.39), (0.048, 0.84, 0.73), (0.774, 0.29, 0.61),
    (0.202, 1.89, 1.06),
)  # fmt: skip
HEAD_EXACT = 1 << 10
BLOCK_ROWS = 1 << 16


@dataclass(frozen=True)
class SynthParams:
    cardinalities: tuple[int, ...] = CRITEO_KAGGLE_CARDINALITIES
    zipf_s: tuple[float, ...] = CRITEO_KAGGLE_ZIPF_S
    zipf_q: float = 0.0
    missing: tuple[float, ...] = CRITEO_KAGGLE_MISSING
    dense: tuple[tuple[float, float, float], ...] = CRITEO_KAGGLE_DENSE
    click_rate: float = 0.25
    extra: dict = field(default_factory=dict)


PRESETS = {"criteo-kaggle": SynthParams()}


def preset_params(preset: str = "criteo-kaggle", **params) -> SynthParams:
    """The preset's parameters with overrides; scalars for per-feature tuples broadcast."""
    if preset not in PRESETS:
        raise TraceError(f"unknown synth preset {preset!r}: expected one of {', '.join(PRESETS)}")
    base = PRESETS[preset]
    n = len(base.cardinalities)
    over = {}
    for k, v in params.items():
        if not hasattr(base, k):
            raise TraceError(f"unknown synth parameter {k!r}")
        if k in ("cardinalities", "zipf_s", "missing") and np.isscalar(v):
            v = (type(getattr(base, k)[0])(v),) * n
        over[k] = tuple(v) if isinstance(v, list) else v
    p = replace(base, **over)
    m = len(p.cardinalities)
    if m != 26 or len(p.zipf_s) != m or len(p.missing) != m:
        raise TraceError("synth: the Criteo layout needs 26 entries in cardinalities, zipf_s and missing")
    if min(p.cardinalities) < 1 or max(p.cardinalities) > 1 << 32:
        raise TraceError("synth: cardinalities must be within 1..2**32 (IDs are 8 hex characters)")
    return p


# ---------------------------------------------------------------------------------------
# Rank sampling and the rank -> ID bijection
# ---------------------------------------------------------------------------------------
class ZipfSampler:
    """Ranks 0..V-1 with P(r) proportional to (r + 1 + q)^-s; exact head, continuous tail."""

    def __init__(self, V: int, s: float, q: float = 0.0) -> None:
        self.V, self.s, self.q = int(V), float(s), float(q)
        k = min(self.V, HEAD_EXACT)
        w = (np.arange(1, k + 1, dtype=np.float64) + q) ** -s
        self.head_cdf = np.cumsum(w)
        head_mass = self.head_cdf[-1]
        self.a, self.b = k + 0.5 + q, self.V + 0.5 + q
        tail_mass = self._integral(self.a, self.b) if self.V > k else 0.0
        self.total = head_mass + tail_mass
        self.p_head = head_mass / self.total
        self.head_cdf /= head_mass
        self.k = k

    def _integral(self, a: float, b: float) -> float:
        if abs(self.s - 1.0) < 1e-9:
            return float(np.log(b / a))
        return float((b ** (1 - self.s) - a ** (1 - self.s)) / (1 - self.s))

    def probabilities(self, ranks: np.ndarray) -> np.ndarray:
        """P(rank) for 0-based ranks (the tail uses the point density, a close approximation)."""
        r = np.asarray(ranks, dtype=np.float64)
        return (r + 1 + self.q) ** -self.s / self.total

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        u = rng.random(n)
        in_head = u < self.p_head
        out = np.empty(n, dtype=np.int64)
        out[in_head] = np.searchsorted(self.head_cdf, u[in_head] / self.p_head, side="right")
        t = ~in_head
        if t.any():
            v = (u[t] - self.p_head) / (1 - self.p_head)
            s = self.s
            if abs(s - 1.0) < 1e-9:
                x = self.a * (self.b / self.a) ** v
            else:
                lo, hi = self.a ** (1 - s), self.b ** (1 - s)
                x = (lo + v * (hi - lo)) ** (1 / (1 - s))
            out[t] = np.clip(np.floor(x - self.q + 0.5).astype(np.int64) - 1, self.k, self.V - 1)
        np.minimum(out, self.V - 1, out=out)
        return out


_M1, _M2 = np.uint64(0x7FEB352D), np.uint64(0x846CA68B)
_MASK32 = np.uint64(0xFFFFFFFF)


def scramble(ranks: np.ndarray, feature: int) -> np.ndarray:
    """Fixed bijection of [0, 2^32) (lowbias32 rounds after a per-feature xor): rank -> ID."""
    x = (np.asarray(ranks, dtype=np.uint64) ^ np.uint64((0x9E3779B9 * (feature + 1)) & 0xFFFFFFFF)) & _MASK32
    x ^= x >> np.uint64(16)
    x = (x * _M1) & _MASK32
    x ^= x >> np.uint64(15)
    x = (x * _M2) & _MASK32
    x ^= x >> np.uint64(16)
    return x.astype(np.int64)


def _hex8_column(ids: np.ndarray, present: np.ndarray, newline: bool = False) -> pa.Array:
    """uint32 IDs -> 8 lowercase hex chars ('' where missing), built as one byte buffer.

    With `newline`, every value (missing ones too) ends in '\n': the last column of a line.
    """
    n = len(ids)
    x = ids.astype(np.uint64) & _MASK32
    if not newline:
        x = x[present]
    # Spread the 8 nibbles into 8 bytes, then map 0-9/10-15 to '0'-'9'/'a'-'f' in SWAR.
    x = (x | (x << np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    x = (x | (x << np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = (x | (x << np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    letter = ((x + np.uint64(0x0606060606060606)) >> np.uint64(4)) & np.uint64(0x0101010101010101)
    x = x + np.uint64(0x3030303030303030) + letter * np.uint64(0x27)
    chars = x.astype(">u8").view(np.uint8).reshape(-1, 8)
    width = 9 if newline else 8
    if newline:
        chars = np.concatenate([chars, np.full((n, 1), ord("\n"), np.uint8)], axis=1)
    lengths = np.where(present, width, width - 8).astype(np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if newline:
        data = chars.ravel() if present.all() else chars.ravel()[_bytes_mask(present, width)]
    else:
        data = chars.ravel()
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _bytes_mask(present: np.ndarray, width: int) -> np.ndarray:
    """Which bytes of the [n, width] value matrix to keep: all of present rows, the '\n' of others."""
    m = np.repeat(present[:, None], width, axis=1)
    m[:, -1] = True
    return m.ravel()


def _block(params: SynthParams, samplers: list[ZipfSampler], seed: int, block: int, n: int) -> bytes:
    rng = np.random.Generator(np.random.PCG64([seed, block]))
    cols: list[pa.Array] = []
    labels = (rng.random(n) < params.click_rate).astype(np.int64)
    cols.append(pc.cast(pa.array(labels), pa.string()))
    for miss, mu, sigma in params.dense:
        vals = np.floor(np.expm1(np.maximum(rng.normal(mu, sigma, n), 0.0))).astype(np.int64)
        if mu > 2.0 and sigma > 2.0:  # I2-like: a few small negative values
            neg = rng.random(n) < 0.1
            vals[neg] = -rng.integers(1, 3, int(neg.sum()))
        arr = pc.cast(pa.array(vals), pa.string())
        present = rng.random(n) >= miss
        cols.append(pc.if_else(pa.array(present), arr, pa.scalar("")))
    last = len(samplers) - 1
    for j, sampler in enumerate(samplers):
        ranks = sampler.sample(rng, n)
        present = rng.random(n) >= params.missing[j]
        cols.append(_hex8_column(scramble(ranks, j), present, newline=j == last))
    # The last column carries each line's '\n', so the joined buffer is the file's bytes.
    lines = pc.binary_join_element_wise(*cols, "\t")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=n + 1 + lines.offset)[lines.offset :]
    return np.frombuffer(lines.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].tobytes()


def _drain(queue: deque, sink) -> int:
    fut, n = queue.popleft()
    sink.write(fut.result())
    return n


# Bytes a written row takes at least (measured: 241 TSV, 93 gzip, 760 Parquet multi-hot)
MIN_ROW_BYTES = {"tsv": 200, "gzip": 60, "parquet": 500}


def check_room(path: str, rows: int, row_bytes: int) -> None:
    """Refuse, before writing, a file larger than the free space of the disk it goes to."""
    need = rows * row_bytes
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # a missing folder is named by the output check
    if need > free:
        raise TraceError(f"{path}: No space left on device for {rows:,} rows (they take at least "
                         f"{_size(need)}; {_size(free)} free there)")


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.1f} kB"


def generate_criteo(
    path: str | os.PathLike,
    rows: int,
    seed: int = 0,
    preset: str = "criteo-kaggle",
    progress=None,
    **params,
) -> dict:
    """Write `rows` synthetic rows in Criteo TSV layout to `path` (atomically). Returns a summary."""
    if rows < 0:
        raise TraceError(f"synth: rows must be >= 0, got {rows}")
    p = preset_params(preset, **params)
    samplers = [ZipfSampler(V, s, p.zipf_q) for V, s in zip(p.cardinalities, p.zipf_s)]
    path = os.fspath(path)
    gz = path.endswith(".gz")
    written = 0

    def write(raw) -> None:
        nonlocal written
        sink = pa.CompressedOutputStream(raw, "gzip") if gz else raw
        # Blocks are generated in parallel threads (numpy and pyarrow release the GIL)
        # and written in order; each block has its own RNG stream, so output is identical.
        workers = max(1, min(4, os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="picasso-synth") as pool:
            queue: deque = deque()
            for b, start in enumerate(range(0, rows, BLOCK_ROWS)):
                queue.append((pool.submit(_block, p, samplers, seed, b, min(BLOCK_ROWS, rows - start)),
                              min(BLOCK_ROWS, rows - start)))  # fmt: skip
                while len(queue) > 2 * workers or (queue and queue[0][0].done()):
                    written += _drain(queue, sink)
                    if progress is not None:
                        progress(written, rows)
            while queue:
                written += _drain(queue, sink)
                if progress is not None:
                    progress(written, rows)
        if gz:
            sink.close()

    check_output_path(path)  # before generating anything
    check_room(path, rows, MIN_ROW_BYTES["gzip" if gz else "tsv"])
    atomic_write(path, write)
    return {"path": path, "rows": rows, "seed": seed, "preset": preset, "features": len(p.cardinalities)}


# ---------------------------------------------------------------------------------------
# Multi-hot Criteo (MLPerf DLRM-DCNv2): bags of IDs per feature, written as Parquet lists
# ---------------------------------------------------------------------------------------
# MLPerf's 40M-capped hashed Criteo 1TB cardinalities and IDs per sample of C1..C26
CRITEO_1TB_CARDINALITIES = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346,
    10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)  # fmt: skip
CRITEO_MULTIHOT_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
MULTIHOT_PRESETS = ("criteo-multihot",)


def generate_criteo_multihot(path: str | os.PathLike, rows: int, seed: int = 0, progress=None,
                             zipf_s: float = 1.05, click_rate: float = 0.25, **_: object) -> dict:
    """`rows` synthetic samples shaped as MLPerf's multi-hot Criteo 1TB, as Parquet: label, I1..I13
    (floats) and C1..C26 as lists of exactly the feature's multi-hot size of Zipf(zipf_s) IDs."""
    import pyarrow.parquet as pq

    if rows < 0:
        raise TraceError(f"synth: rows must be >= 0, got {rows}")
    path = os.fspath(path)
    if not path.endswith(".parquet"):
        raise TraceError(f"{path}: the criteo-multihot preset writes Parquet (name the file .parquet)")
    check_room(path, rows, MIN_ROW_BYTES["parquet"])
    samplers = [ZipfSampler(V, zipf_s) for V in CRITEO_1TB_CARDINALITIES]
    writer = None
    tmp = path + ".tmp"
    try:
        for b, start in enumerate(range(0, rows, BLOCK_ROWS)):
            n = min(BLOCK_ROWS, rows - start)
            rng = np.random.Generator(np.random.PCG64([seed, b]))
            cols = {"label": pa.array((rng.random(n) < click_rate).astype(np.int64))}
            for i, (_, mu, sigma) in enumerate(CRITEO_KAGGLE_DENSE):
                cols[f"I{i + 1}"] = pa.array(np.floor(np.expm1(np.maximum(rng.normal(mu, sigma, n), 0.0))))
            for j, (sampler, k) in enumerate(zip(samplers, CRITEO_MULTIHOT_SIZES)):
                ids = scramble(sampler.sample(rng, n * k), j) % CRITEO_1TB_CARDINALITIES[j]
                cols[f"C{j + 1}"] = pa.ListArray.from_arrays(np.arange(0, n * k + 1, k, dtype=np.int32),
                                                             pa.array(ids))
            table = pa.table(cols)
            writer = writer or pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            if progress is not None:
                progress(start + n, rows)
        if writer is not None:
            writer.close()
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"path": path, "rows": rows, "seed": seed, "preset": "criteo-multihot", "features": 26,
            "multi_hot": list(CRITEO_MULTIHOT_SIZES)}
