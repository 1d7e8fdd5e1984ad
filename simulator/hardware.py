"""Hardware specs: a cluster of nodes x devices (GPUs, or CPU worker processes).

A spec is plain data (dataclasses) read from a preset (simulator/presets/*.yaml), a YAML or
JSON file, and edited by `key=value` overrides with units ("gpu.hbm_bw=3.35TB/s").
Units inside a spec: bytes, bytes/s, FLOP/s, microseconds.

Efficiency factors (`efficiency`, all default 1.0) multiply the peak rates so calibration can
fit them. Documented keys:
  compute, hbm, host, pcie, intra, nic      -- per resource (every op using it)
  all_to_all, all_reduce, all_gather, reduce_scatter, broadcast -- per collective type
  any other key (e.g. gemm, gather)         -- picked by an op through args["eff_key"]

What a machine's calibration measured beyond these (per world size, per op class, host gaps,
collective waits) is the typed `calibration` section (simulator.calibration_spec); old files
that kept it as string keys in `efficiency` are converted when loaded.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from foundation.documents import DocumentError, read_spec
from foundation.fields import MAX_RANKS
from foundation.files import atomic_write_text
from simulator.calibration_spec import Calibration, CalibrationSpecError, from_legacy_efficiency
from simulator.device_perf import RANDOM_KEY, DevicePerf, DevicePerfError, GemmShape


class HardwareError(ValueError):
    """A bad hardware spec or override; the message is one line naming the field."""


RESOURCE_EFF_KEYS = ("compute", "hbm", "host", "pcie", "intra", "nic")
COLLECTIVE_EFF_KEYS = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter", "broadcast")
OP_EFF_KEYS = ("gemm", "gather", RANDOM_KEY)  # the eff_key lowering gives an op
EFF_KEYS = RESOURCE_EFF_KEYS + COLLECTIVE_EFF_KEYS + OP_EFF_KEYS

# Physical ranges, far past any machine either way: a figure outside is a unit slip or a forged file,
# and would predict infinite or NaN times (1e-300 B/s) rather than be refused.
BANDWIDTH = (1e6, 1e16)  # B/s: 1 MB/s .. 10 PB/s
FLOP_RATE = (1e6, 1e19)  # FLOP/s
MEMORY = (1e6, 1e16)  # bytes
LATENCY_US = (0.0, 1e6)  # a second
EFFICIENCY = (1e-4, 1e4)  # a factor on a peak rate (calibrate clips its fits to the same)
STREAMS = (1, 1024)  # concurrent streams of one device
CORES = (0, 1 << 20)  # CPU cores of one worker


@dataclass
class DeviceSpec:
    """One GPU, or one CPU worker process (then `hbm_*` is its DRAM share, flops its cores)."""

    hbm_bytes: float
    hbm_bw: float  # B/s
    flops: dict[str, float]  # dtype -> peak FLOP/s
    launch_us: float = 5.0  # per-kernel (or per-op dispatch) overhead
    streams: int = 4  # concurrent streams the device runs well
    cores: int = 0  # CPU cores per worker (kind "cpu"); informational for gpu


@dataclass
class HostSpec:
    dram_bytes: float  # per node
    dram_bw: float  # B/s per node


@dataclass
class HardwareSpec:
    name: str
    kind: str  # "gpu" | "cpu"
    nodes: int
    gpus_per_node: int
    gpu: DeviceSpec
    host: HostSpec
    pcie_bw: float  # B/s per direction per device (host <-> device)
    nvlink_bw: float  # B/s per device per direction inside a node (NVLink/NVSwitch, PCIe P2P, loopback)
    nic_bw: float  # B/s per direction, per GPU or per node (nic_per)
    nic_per: str = "gpu"  # "gpu" | "node"
    nic_latency_us: float = 5.0
    intra_latency_us: float = 2.0
    efficiency: dict[str, float] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # figure -> public source
    calibration: Calibration | None = None  # measured on this machine (simulator.calibration_spec)
    perf: DevicePerf = field(default_factory=DevicePerf)  # achieved / peak (simulator.device_perf)

    def __post_init__(self) -> None:
        validate_hardware(self)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def device(self) -> DeviceSpec:
        return self.gpu

    @property
    def device_memory(self) -> str:
        """What a rank's own memory is called on this hardware: a GPU's, or a CPU worker's share of RAM."""
        return "CPU rank memory" if self.kind == "cpu" else "GPU memory"

    def placement_name(self, placement: str) -> str:
        """A pack placement ("hbm" or "host") named by what it is on this hardware."""
        return "rank RAM" if self.kind == "cpu" and placement == "hbm" else str(placement)

    def resource_name(self, resource: str) -> str:
        """A cost-model resource named by what it is on this hardware (a CPU rank's "hbm" is its RAM)."""
        return "ram" if self.kind == "cpu" and resource == "hbm" else resource

    def eff(self, key: str | None) -> float:
        """Efficiency factor for `key` (1.0 when absent or None)."""
        if not key:
            return 1.0
        return float(self.efficiency.get(key, 1.0))

    def hbm_rate(self, eff_key: str | None = None) -> float:
        """Device memory bytes per second an op with `eff_key` moves (streaming, or random rows)."""
        return self.gpu.hbm_bw * self.eff("hbm") * self.perf.hbm_fraction(eff_key)

    def flops_rate(self, dtype: str, eff_key: str | None = None) -> float:
        """FLOP/s an op of `dtype` with `eff_key` reaches (a GEMM: its shape class's fraction)."""
        return self.flops_for(dtype) * self.eff("compute") * self.perf.gemm_fraction(
            dtype, GemmShape.from_eff_key(eff_key))

    def nic_bw_per_device(self) -> float:
        """NIC bandwidth one device gets when every device of its node sends at once."""
        return self.nic_bw if self.nic_per == "gpu" else self.nic_bw / self.gpus_per_node

    def intra_bw(self) -> float:
        """Device-to-device bandwidth inside a node; falls back to PCIe when there is no NVLink."""
        return self.nvlink_bw if self.nvlink_bw > 0 else self.pcie_bw

    def flops_for(self, dtype: str) -> float:
        f = self.gpu.flops.get(dtype)
        if f is None:
            f = self.gpu.flops.get("fp32")
        if f is None:
            raise HardwareError(f"hardware {self.name}: no gpu.flops entry for dtype {dtype!r} (nor fp32)")
        return float(f)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        cal = self.calibration
        self.calibration = None  # asdict would copy it field by field; it writes its own form
        try:
            d = asdict(self)
        finally:
            self.calibration = cal
        d.pop("calibration")
        d["perf"] = self.perf.to_dict()
        if cal is not None:
            d["calibration"] = cal.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "hardware") -> HardwareSpec:
        return _build(dict(d), where)

    def save(self, path: str | os.PathLike) -> None:
        """YAML for .yaml/.yml, JSON otherwise; written atomically."""
        p = Path(path)
        if p.suffix in (".yaml", ".yml"):
            atomic_write_text(p, yaml.safe_dump(self.to_dict(), sort_keys=False))
        else:
            atomic_write_text(p, json.dumps(self.to_dict(), indent=1))


# ----------------------------------------------------------------------------- validation

_TOP = {f.name for f in fields(HardwareSpec)}
_DEV = {f.name for f in fields(DeviceSpec)}
_HOST = {f.name for f in fields(HostSpec)}
_REQUIRED_TOP = {"name", "kind", "nodes", "gpus_per_node", "gpu", "host", "pcie_bw", "nvlink_bw", "nic_bw"}
_REQUIRED_DEV = {"hbm_bytes", "hbm_bw", "flops"}
_REQUIRED_HOST = {"dram_bytes", "dram_bw"}


def _num(v: Any, where: str, *, positive: bool = False, integer: bool = False,
         within: tuple[float, float] | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        if isinstance(v, str):
            v = parse_quantity(v, where)
        else:
            raise HardwareError(f"{where}: expected a number, got {v!r}")
    try:
        finite = math.isfinite(v)
    except OverflowError:  # an integer past any float
        finite = False
    if not finite or v < 0 or (positive and v == 0):  # NaN and infinity too (JSON and YAML allow both)
        raise HardwareError(f"{where}: expected a finite {'positive' if positive else 'non-negative'} number, "
                            f"got {_shown(v)}")
    if within is not None:
        _check_range(float(v), within, where)
    if integer:
        if int(v) != v:
            raise HardwareError(f"{where}: expected an integer, got {v!r}")
        return int(v)
    return float(v)


def _check_range(v: float, within: tuple[float, float], where: str) -> None:
    lo, hi = within
    if not lo <= v <= hi:
        raise HardwareError(f"{where}: {_shown(v)} is outside [{lo:g}, {hi:g}], the range of any real machine")


def _check_eff_keys(eff: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(eff) - set(EFF_KEYS))
    if unknown:
        raise HardwareError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(EFF_KEYS)})")


def _shown(v: Any) -> str:
    """A value as a message shows it: a 400-digit number from a file is cut short."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_keys(d: Mapping[str, Any], allowed: set[str], required: set[str], where: str) -> None:
    if not isinstance(d, Mapping):
        raise HardwareError(f"{where}: expected a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise HardwareError(f"{where}: unknown key {unknown[0]!r} (expected one of {', '.join(sorted(allowed))})")
    missing = sorted(required - set(d))
    if missing:
        raise HardwareError(f"{where}: missing key {missing[0]!r}")


def _build(d: dict[str, Any], where: str) -> HardwareSpec:
    if "device" in d and "gpu" not in d:  # alias
        d["gpu"] = d.pop("device")
    _check_keys(d, _TOP, _REQUIRED_TOP, where)
    g = dict(d["gpu"]) if isinstance(d["gpu"], Mapping) else d["gpu"]
    h = dict(d["host"]) if isinstance(d["host"], Mapping) else d["host"]
    _check_keys(g, _DEV, _REQUIRED_DEV, f"{where}: gpu")
    _check_keys(h, _HOST, _REQUIRED_HOST, f"{where}: host")
    if not isinstance(g["flops"], Mapping) or not g["flops"]:
        raise HardwareError(f"{where}: gpu.flops: expected a mapping dtype -> FLOP/s")
    dev = DeviceSpec(
        hbm_bytes=_num(g["hbm_bytes"], f"{where}: gpu.hbm_bytes", positive=True, within=MEMORY),
        hbm_bw=_num(g["hbm_bw"], f"{where}: gpu.hbm_bw", positive=True, within=BANDWIDTH),
        flops={str(k): _num(v, f"{where}: gpu.flops.{k}", positive=True, within=FLOP_RATE)
               for k, v in g["flops"].items()},
        launch_us=_num(g.get("launch_us", 5.0), f"{where}: gpu.launch_us", within=LATENCY_US),
        streams=_num(g.get("streams", 4), f"{where}: gpu.streams", positive=True, integer=True, within=STREAMS),
        cores=_num(g.get("cores", 0), f"{where}: gpu.cores", integer=True, within=CORES),
    )
    host = HostSpec(
        dram_bytes=_num(h["dram_bytes"], f"{where}: host.dram_bytes", positive=True, within=MEMORY),
        dram_bw=_num(h["dram_bw"], f"{where}: host.dram_bw", positive=True, within=BANDWIDTH),
    )
    eff = d.get("efficiency") or {}
    if not isinstance(eff, Mapping):
        raise HardwareError(f"{where}: efficiency: expected a mapping key -> factor")
    eff = {str(k): _num(v, f"{where}: efficiency.{k}", positive=True) for k, v in eff.items()}
    src = d.get("source") or {}
    cal = d.get("calibration")
    try:
        cal = None if cal is None else Calibration.from_dict(cal, f"{where}: calibration")
    except CalibrationSpecError as exc:
        raise HardwareError(str(exc)) from None
    # an old file's string keys (or such a key set by an override) go into the typed calibration
    eff, cal = from_legacy_efficiency(eff, cal)
    _check_eff_keys(eff, f"{where}: efficiency")
    try:
        perf = DevicePerf.from_dict(d.get("perf"), f"{where}: perf")
    except DevicePerfError as exc:
        raise HardwareError(str(exc)) from None
    return HardwareSpec(
        name=str(d["name"]),
        kind=str(d["kind"]),
        nodes=_num(d["nodes"], f"{where}: nodes", positive=True, integer=True),
        gpus_per_node=_num(d["gpus_per_node"], f"{where}: gpus_per_node", positive=True, integer=True),
        gpu=dev,
        host=host,
        pcie_bw=_num(d["pcie_bw"], f"{where}: pcie_bw", positive=True, within=BANDWIDTH),
        nvlink_bw=_nvlink(_num(d["nvlink_bw"], f"{where}: nvlink_bw"), f"{where}: nvlink_bw"),
        nic_bw=_num(d["nic_bw"], f"{where}: nic_bw", positive=True, within=BANDWIDTH),
        nic_per=str(d.get("nic_per", "gpu")),
        nic_latency_us=_num(d.get("nic_latency_us", 5.0), f"{where}: nic_latency_us", within=LATENCY_US),
        intra_latency_us=_num(d.get("intra_latency_us", 2.0), f"{where}: intra_latency_us", within=LATENCY_US),
        efficiency={str(k): _num(v, f"{where}: efficiency.{k}", positive=True, within=EFFICIENCY)
                    for k, v in eff.items()},
        source={str(k): str(v) for k, v in dict(src).items()},
        calibration=cal,
        perf=perf,
    )


def _nvlink(v: float, where: str) -> float:
    """0 means no link of its own (collectives inside a node then use PCIe); else a bandwidth."""
    if v != 0:
        _check_range(v, BANDWIDTH, where)
    return v


def validate_hardware(hw: HardwareSpec) -> None:
    """Checks what the constructor cannot see from types alone (also on hand-built specs)."""
    w = f"hardware {hw.name}"
    if hw.kind not in ("gpu", "cpu"):
        raise HardwareError(f"{w}: kind: expected 'gpu' or 'cpu', got {hw.kind!r}")
    if hw.nic_per not in ("gpu", "node"):
        raise HardwareError(f"{w}: nic_per: expected 'gpu' or 'node', got {hw.nic_per!r}")
    for key in ("nodes", "gpus_per_node"):
        v = getattr(hw, key)
        if not isinstance(v, int) or v < 1:
            raise HardwareError(f"{w}: {key}: expected a positive integer, got {v!r}")
    if hw.nodes * hw.gpus_per_node > MAX_RANKS:
        raise HardwareError(f"{w}: nodes x gpus_per_node = {hw.nodes * hw.gpus_per_node:,} devices, "
                            f"more than the {MAX_RANKS:,} picasso plans for")
    for key in ("pcie_bw", "nic_bw"):
        if not getattr(hw, key) > 0:
            raise HardwareError(f"{w}: {key}: expected a positive number, got {getattr(hw, key)!r}")
    for key in ("nvlink_bw", "nic_latency_us", "intra_latency_us"):
        if not getattr(hw, key) >= 0:
            raise HardwareError(f"{w}: {key}: expected a non-negative number, got {getattr(hw, key)!r}")
    if not (hw.gpu.hbm_bw > 0 and hw.gpu.hbm_bytes > 0 and hw.host.dram_bw > 0 and hw.host.dram_bytes > 0):
        raise HardwareError(f"{w}: gpu.hbm_*/host.dram_* must be positive")
    if not hw.gpu.launch_us >= 0:
        raise HardwareError(f"{w}: gpu.launch_us: expected a non-negative number, got {hw.gpu.launch_us!r}")
    for k, v in hw.gpu.flops.items():
        if not v > 0:
            raise HardwareError(f"{w}: gpu.flops.{k}: expected a positive number, got {v!r}")
    for k, v in hw.efficiency.items():
        if not v > 0:
            raise HardwareError(f"{w}: efficiency.{k}: expected a positive factor, got {v!r}")
    # the physical ranges, for specs built by hand as well as read
    for key, value, within in (("pcie_bw", hw.pcie_bw, BANDWIDTH), ("nic_bw", hw.nic_bw, BANDWIDTH),
                               ("gpu.hbm_bw", hw.gpu.hbm_bw, BANDWIDTH), ("host.dram_bw", hw.host.dram_bw, BANDWIDTH),
                               ("gpu.hbm_bytes", hw.gpu.hbm_bytes, MEMORY), ("host.dram_bytes", hw.host.dram_bytes, MEMORY),
                               ("gpu.launch_us", hw.gpu.launch_us, LATENCY_US),
                               ("nic_latency_us", hw.nic_latency_us, LATENCY_US),
                               ("intra_latency_us", hw.intra_latency_us, LATENCY_US),
                               ("gpu.streams", hw.gpu.streams, STREAMS), ("gpu.cores", hw.gpu.cores, CORES),
                               *((f"gpu.flops.{k}", v, FLOP_RATE) for k, v in hw.gpu.flops.items()),
                               *((f"efficiency.{k}", v, EFFICIENCY) for k, v in hw.efficiency.items())):
        _check_range(float(value), within, f"{w}: {key}")
    _nvlink(hw.nvlink_bw, f"{w}: nvlink_bw")
    _check_eff_keys(hw.efficiency, f"{w}: efficiency")


# ----------------------------------------------------------------------------- units

_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME_US = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}


def _unit_factor(unit: str) -> tuple[float, str] | None:
    """(factor to base unit, dimension) for a unit string; dimensions: bytes, bw, flops, time."""
    if unit in _TIME_US:
        return _TIME_US[unit], "time"
    m = re.fullmatch(r"(Ki|Mi|Gi|Ti|Pi|K|k|M|G|T|P)?(B|bit|FLOP)(/s)?", unit)
    if not m:
        return None
    pre, base, per_s = m.group(1) or "", m.group(2), m.group(3)
    pre = "K" if pre == "k" else pre
    f = _BIN[pre] if pre in _BIN else _SI[pre]
    if base == "bit":
        if not per_s:
            return None
        return f / 8.0, "bw"
    if base == "FLOP":
        return (f, "flops") if per_s else None
    return f, ("bw" if per_s else "bytes")


def parse_quantity(text: str, where: str = "value") -> float:
    """'3.35TB/s' -> 3.35e12; '200Gbit/s' -> 2.5e10; '5us' -> 5; '80GiB' -> 85899345920; '1e9' -> 1e9."""
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*", str(text))
    if not m:
        raise HardwareError(f"{where}: cannot read quantity {text!r} (expected e.g. 3.35TB/s, 80GB, 5us)")
    value, unit = float(m.group(1)), m.group(2)
    if not unit:
        return value
    uf = _unit_factor(unit)
    if uf is None:
        raise HardwareError(f"{where}: unknown unit {unit!r} in {text!r} (B, GB, GiB, GB/s, Gbit/s, TFLOP/s, us, ms)")
    return value * uf[0]


def _expected_dimension(path: str) -> str | None:
    leaf = path.split(".")[-1]
    if path.startswith("gpu.flops.") or path.startswith("device.flops."):
        return "flops"
    if leaf.endswith("_bw"):
        return "bw"
    if leaf.endswith("_bytes"):
        return "bytes"
    if leaf.endswith("_us"):
        return "time"
    return None


def _parse_override_value(path: str, text: Any) -> Any:
    if not isinstance(text, str):
        return text
    dim = _expected_dimension(path)
    m = re.fullmatch(r"\s*[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*([A-Za-zµ/]*)\s*", text)
    if not m:
        if dim is not None:
            raise HardwareError(f"override {path}: cannot read quantity {text!r}")
        return text  # a string field (name, kind, nic_per)
    unit = m.group(1)
    if unit and dim is not None:
        uf = _unit_factor(unit)
        if uf is not None and uf[1] != dim:
            raise HardwareError(f"override {path}: unit {unit!r} is a {uf[1]} unit, expected a {dim} unit")
    v = parse_quantity(text, f"override {path}")
    if not math.isfinite(v):
        raise HardwareError(f"override {path}: {_shown(text)} is not a finite number")
    return int(v) if path in ("nodes", "gpus_per_node", "gpu.streams", "gpu.cores") and v == int(v) else v


def apply_overrides(hw: HardwareSpec, overrides: Sequence[str] | Mapping[str, Any]) -> HardwareSpec:
    """A new spec with `key=value` overrides applied (dotted keys into gpu/host/efficiency)."""
    d = hw.to_dict()
    items = list(overrides.items()) if isinstance(overrides, Mapping) else [_split_override(o) for o in overrides]
    for key, text in items:
        path = key.strip().replace("device.", "gpu.", 1) if key.strip().startswith("device.") else key.strip()
        parts = path.split(".")
        node: Any = d
        for i, part in enumerate(parts[:-1]):
            if not isinstance(node, dict) or part not in node:
                raise HardwareError(f"override {key}: unknown key {'.'.join(parts[: i + 1])!r}")
            node = node[part]
        leaf = parts[-1]
        open_maps = len(parts) >= 2 and parts[-2] in ("flops", "efficiency", "source")
        if not isinstance(node, dict) or (leaf not in node and not open_maps):
            raise HardwareError(f"override {key}: unknown key {path!r}")
        if isinstance(node.get(leaf), dict):
            raise HardwareError(f"override {key}: {path!r} is a section, set one of its keys")
        node[leaf] = _parse_override_value(path, text)
    return HardwareSpec.from_dict(d, where=f"hardware {hw.name} (after overrides)")


def _split_override(text: str) -> tuple[str, str]:
    key, sep, value = str(text).partition("=")
    if not sep or not key.strip() or not value.strip():
        raise HardwareError(f"override {text!r}: expected key=value, e.g. gpu.hbm_bw=3.35TB/s")
    return key.strip(), value.strip()


# ----------------------------------------------------------------------------- presets

PRESET_DIR = Path(__file__).with_name("presets")
PRESETS = ("p2res-v100", "dgx-a100", "dgx-h100", "h200", "local-cpu")


def load_hardware(name_or_path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = ()) -> HardwareSpec:
    """A preset name (see PRESETS) or a YAML/JSON file, then `overrides` applied."""
    s = str(name_or_path)
    preset = PRESET_DIR / f"{s}.yaml"
    if s in PRESETS or (preset.exists() and os.sep not in s):
        path = preset
    else:
        path = Path(s)
        if not path.exists():
            raise HardwareError(f"hardware {s!r}: neither a preset ({', '.join(PRESETS)}) nor an existing file")
    try:
        data = read_spec(path, "hardware spec")  # bounded: size, nesting, aliases, tags
    except (OSError, DocumentError) as exc:
        raise HardwareError(str(exc)) from None
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise HardwareError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: expected a mapping at top level")
    hw = _build(data, str(path))
    return apply_overrides(hw, overrides) if overrides else hw
