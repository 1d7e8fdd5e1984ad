"""What a device achieves against its datasheet peaks: the `perf` section of a hardware spec.

Peaks (gpu.flops, gpu.hbm_bw, pcie_bw) come from datasheets; no kernel reaches them. The
factors here are achieved / peak, measured by microbenchmarks (`picasso calibrate` on CUDA
writes them, executor.measure.microbench) or taken from published ones, each with its source:

| field | meaning | applies to |
| --- | --- | --- |
| `gemm[dtype][shape]` | achieved FLOP/s of a GEMM / gpu.flops[dtype]; shape `square` (8192^3) or `skinny` (65536 x 512 x 512, the MLP layers of a recommendation model) | ops with eff_key `gemm` (skinny) or `gemm_square` |
| `hbm_stream` | a device copy's bytes (read + write) per second / gpu.hbm_bw | every op's HBM bytes and fixed_hbm_bytes (elementwise passes, sorts) |
| `hbm_random` | a gather of random rows (bytes read + written) per second / gpu.hbm_bw | ops with eff_key `random` (embedding gathers, pooling, sparse updates) |
| `pcie` | pinned host-to-device copy / pcie_bw | PCIe bytes |
| `parallel_units` | units (SMs) a memory-bound kernel spreads over; one segment (a run of one row in a segment sum) is streamed by one unit alone | ops' `run_bytes` |
| `step_host_us` | host time per step that no kernel hides (Python, allocator, synchronisations) | a rank's first op of the step |
| `tlb_reach_bytes` | bytes of device memory the last-level TLB maps (entries x page size); 0: no TLB term | random-row ops' `span_bytes` |
| `tlb_miss_cost` | extra time of a random row whose page misses that TLB, as a share of the row's own access (it waits for a page walk) | the same |

Random rows and the TLB: a gather over a span larger than the TLB's reach misses it for the share
1 - reach / span of its rows, and each miss walks the page table, so its rate falls to hbm_random /
(1 + tlb_miss_cost x (1 - reach / span)). Published training throughput shows it: the same model
on the same GPUs trains 10-17% slower on Criteo 1TB's 883M table rows than on its 178M.

The per-kernel cost is gpu.launch_us (an op's `launch` counts its kernels). A CPU spec keeps
every factor 1.0: its `picasso calibrate` fits the `efficiency` keys instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class DevicePerfError(ValueError):
    """A malformed perf section; the message names the field."""


class GemmShape(str, Enum):
    """GEMM shape classes the presets and the calibration measure."""

    SQUARE = "square"  # 8192 x 8192 x 8192
    SKINNY = "skinny"  # 65536 x 512 x 512: a batch through an MLP layer

    @classmethod
    def from_eff_key(cls, key: str | None) -> GemmShape | None:
        """The GEMM class an op's eff_key names (None: the op is no GEMM)."""
        return {"gemm": cls.SKINNY, "gemm_skinny": cls.SKINNY, "gemm_square": cls.SQUARE}.get(key or "")


RANDOM_KEY = "random"  # eff_key of ops whose HBM bytes are random rows


@dataclass
class DevicePerf:
    gemm: dict[str, dict[str, float]] = field(default_factory=dict)  # dtype -> GemmShape value -> fraction
    hbm_stream: float = 1.0
    hbm_random: float = 1.0
    pcie: float = 1.0
    parallel_units: int = 1
    step_host_us: float = 0.0
    tlb_reach_bytes: float = 0.0
    tlb_miss_cost: float = 1.0
    source: dict[str, str] = field(default_factory=dict)  # field -> where its figure comes from

    def gemm_fraction(self, dtype: str, shape: GemmShape | None) -> float:
        """Achieved / peak of a GEMM of `dtype` and `shape` (1.0 for a non-GEMM op, or a dtype
        without figures). A shape missing for the dtype takes the dtype's other shape."""
        if shape is None:
            return 1.0
        per = self.gemm.get(dtype)
        if not per:
            return 1.0
        return float(per.get(shape.value, next(iter(per.values()))))

    def hbm_fraction(self, eff_key: str | None) -> float:
        return self.hbm_random if eff_key == RANDOM_KEY else self.hbm_stream

    def tlb_miss_share(self, span_bytes: float) -> float:
        """The share of random rows over `span_bytes` whose page the TLB does not map."""
        if self.tlb_reach_bytes <= 0 or span_bytes <= self.tlb_reach_bytes:
            return 0.0
        return 1.0 - self.tlb_reach_bytes / span_bytes

    def random_slowdown(self, span_bytes: float) -> float:
        """How much longer random rows over `span_bytes` take than rows within the TLB's reach."""
        return 1.0 + self.tlb_miss_cost * self.tlb_miss_share(span_bytes)

    @property
    def empty(self) -> bool:
        return self == DevicePerf(source=self.source)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.gemm:
            d["gemm"] = {dt: dict(v) for dt, v in self.gemm.items()}
        for k in ("hbm_stream", "hbm_random", "pcie", "parallel_units", "step_host_us"):
            d[k] = getattr(self, k)
        if self.tlb_reach_bytes:
            d["tlb_reach_bytes"] = self.tlb_reach_bytes
            d["tlb_miss_cost"] = self.tlb_miss_cost
        if self.source:
            d["source"] = dict(self.source)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "perf") -> DevicePerf:
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise DevicePerfError(f"{where}: expected a mapping")
        allowed = ("gemm", "hbm_stream", "hbm_random", "pcie", "parallel_units", "step_host_us", "tlb_reach_bytes",
                   "tlb_miss_cost", "source")
        bad = sorted(set(d) - set(allowed))
        if bad:
            raise DevicePerfError(f"{where}: unknown key {bad[0]!r} (expected one of {', '.join(allowed)})")
        gemm = d.get("gemm") or {}
        if not isinstance(gemm, Mapping):
            raise DevicePerfError(f"{where}.gemm: expected a mapping dtype -> {{square, skinny}}")
        out: dict[str, dict[str, float]] = {}
        shapes = {s.value for s in GemmShape}
        for dt, per in gemm.items():
            if not isinstance(per, Mapping) or not per:
                raise DevicePerfError(f"{where}.gemm.{dt}: expected a mapping shape -> fraction")
            unknown = sorted(set(map(str, per)) - shapes)
            if unknown:
                raise DevicePerfError(f"{where}.gemm.{dt}: unknown shape {unknown[0]!r} (expected square, skinny)")
            out[str(dt)] = {str(s): _fraction(v, f"{where}.gemm.{dt}.{s}") for s, v in per.items()}
        units = d.get("parallel_units", 1)
        if isinstance(units, float) and units.is_integer():  # from a --set override
            units = int(units)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise DevicePerfError(f"{where}.parallel_units: expected a positive integer, got {units!r}")
        host = d.get("step_host_us", 0.0)
        if isinstance(host, bool) or not isinstance(host, (int, float)) or not host >= 0:
            raise DevicePerfError(f"{where}.step_host_us: expected a number >= 0, got {host!r}")
        tlb = {k: d.get(k, dflt) for k, dflt in (("tlb_reach_bytes", 0.0), ("tlb_miss_cost", 1.0))}
        for k, v in tlb.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e18:
                raise DevicePerfError(f"{where}.{k}: expected a number >= 0, got {v!r}")
        src = d.get("source") or {}
        if not isinstance(src, Mapping):
            raise DevicePerfError(f"{where}.source: expected a mapping field -> source")
        return cls(gemm=out, hbm_stream=_fraction(d.get("hbm_stream", 1.0), f"{where}.hbm_stream"),
                   hbm_random=_fraction(d.get("hbm_random", 1.0), f"{where}.hbm_random"),
                   pcie=_fraction(d.get("pcie", 1.0), f"{where}.pcie"), parallel_units=units,
                   step_host_us=float(host), tlb_reach_bytes=float(tlb["tlb_reach_bytes"]),
                   tlb_miss_cost=float(tlb["tlb_miss_cost"]), source={str(k): str(v) for k, v in src.items()})


def _fraction(v: Any, where: str) -> float:
    # a factor above 1 would be a rate beyond the datasheet's peak: a wrong peak or a wrong timing
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1.5:
        raise DevicePerfError(f"{where}: expected an achieved/peak fraction in (0, 1.5], got {v!r}")
    return float(v)


@dataclass
class DeviceRates:
    """What a device's microbenchmarks measured (executor.measure.microbench on CUDA), in the units of
    a hardware spec: FLOP/s per dtype and GEMM shape, bytes per second, microseconds."""

    gemm: dict[str, dict[str, float]]  # dtype -> GemmShape value -> FLOP/s
    copy_bw: float  # device copy, bytes read + written per second
    gather_bw: float  # gather of random rows, bytes read + written per second
    scatter_bw: float  # scatter-add of random rows, bytes read + written per second
    h2d_bw: float  # pinned host-to-device copy
    launch_us: float  # per kernel, back-to-back on one stream
    step_host_us: float  # host time of an eager step's bookkeeping that no kernel hides
    device: str = ""  # its name, e.g. "NVIDIA H200"


def perf_from_rates(flops: Mapping[str, float], hbm_bw: float, pcie_bw: float, rates: DeviceRates,
                    base: DevicePerf | None = None, where: str = "") -> DevicePerf:
    """The perf section measured rates give against the spec's peaks (`flops` per dtype,
    `hbm_bw`, `pcie_bw`): each factor is measured / peak, the same meaning as a preset's.
    A dtype the spec has no peak for is left out (its rate has nothing to be a fraction of);
    `parallel_units` stays the base's (a datasheet count)."""
    gemm: dict[str, dict[str, float]] = {}
    for dt, per in rates.gemm.items():
        if dt in flops:
            gemm[dt] = {s: _clip(r / flops[dt]) for s, r in per.items()}
    random = min(rates.gather_bw, rates.scatter_bw)  # a step both gathers and scatters rows
    src = f"picasso calibrate on {rates.device or 'this GPU'}{where}"
    return DevicePerf(gemm=gemm, hbm_stream=_clip(rates.copy_bw / hbm_bw), hbm_random=_clip(random / hbm_bw),
                      pcie=_clip(rates.h2d_bw / pcie_bw), parallel_units=(base or DevicePerf()).parallel_units,
                      step_host_us=float(rates.step_host_us), tlb_reach_bytes=(base or DevicePerf()).tlb_reach_bytes,
                      tlb_miss_cost=(base or DevicePerf()).tlb_miss_cost,
                      source={k: src for k in ("gemm", "hbm_stream", "hbm_random", "pcie", "step_host_us")})


def _clip(x: float) -> float:
    # inside the range a spec accepts: a measured rate above 1.5x a datasheet peak is a wrong peak
    return float(min(max(x, 1e-6), 1.5))
