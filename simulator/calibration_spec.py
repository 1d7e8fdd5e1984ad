"""A machine's calibration: what `picasso calibrate` and `picasso validate`'s refit measured.

Saved with the hardware spec (its `calibration` section) and applied by the cost model when a
graph is simulated (`simulator.compiled.costs`, through `Resolved`), never written into the
graph: a graph simulated under another spec gets that spec's figures.

| field | meaning | fitted by |
| --- | --- | --- |
| `worlds[n].launch_us` | per-op fixed cost at n ranks (the ranks of a CPU "cluster" share cores) | microbenchmarks |
| `worlds[n].intra_latency_us` | collective step latency at n ranks | microbenchmarks |
| `worlds[n].efficiency` | rate factors measured at n ranks (`compute`, `hbm`, `all_to_all`, ...) | microbenchmarks |
| `classes[c]`, `worlds[n].classes[c]` | an op class's fixed cost (in launches), rate factor, and for collectives the factor of their latency terms; pooled over worlds, and per world | executed plans' op timings |
| `worlds[n].op_gap`, `step_gap` | untimed host time per op and per step, in launches | executed plans' timelines |
| `worlds[n].coll_wait` | a collective's wait for slower ranks, per us of compute its rank ran since its previous collective | executed plans' op timings |
| `worlds[n].coll_wait_launches` | the part of that wait that does not grow with the compute (the ranks sharing cores drift apart by a scheduler slice or so), in launches | executed plans' op timings |

Both waits delay a collective's release from when its data is ready; they do not occupy its
lane: a collective queued behind a busy lane pays them only where they outlast the queue
(simulator.compiled).

A spec for n ranks (`simulator.calibration.spec_for_world`) takes the launch, latency and rate
factors of the nearest calibrated world size; the per-class fits of that world override the
pooled ones field by field (`resolve`). Old spec files kept all of this as string keys in
`efficiency` (`w4.lat:op:comm#collective`, `opfixed:<class>`, `collwait`, ...);
`from_legacy_efficiency` converts them on load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class CalibrationSpecError(ValueError):
    """A malformed calibration section; the message names the field."""


@dataclass
class ClassFit:
    """Fitted coefficients of one op class (None: not fitted, the base model's stays)."""

    fixed_launches: float | None = None  # the op's fixed cost in launches of its world, instead of one launch
    rate: float | None = None  # efficiency factor of its flow, instead of the op's eff_key factor
    latency_scale: float | None = None  # collectives: multiplies their latency terms (own and algorithm's)

    def merged(self, over: ClassFit | None) -> ClassFit:
        """This fit with the fields `over` has replacing its own."""
        if over is None:
            return self
        return ClassFit(*(o if o is not None else s for s, o in zip(self.astuple(), over.astuple())))

    def astuple(self) -> tuple[float | None, float | None, float | None]:
        return (self.fixed_launches, self.rate, self.latency_scale)

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("fixed_launches", self.fixed_launches), ("rate", self.rate),
                                  ("latency_scale", self.latency_scale)) if v is not None}


@dataclass
class WorldFit:
    """What was measured at one world size."""

    launch_us: float | None = None
    intra_latency_us: float | None = None
    efficiency: dict[str, float] = field(default_factory=dict)
    classes: dict[str, ClassFit] = field(default_factory=dict)
    op_gap: float | None = None  # launches
    step_gap: float | None = None  # launches
    coll_wait: float | None = None  # us of wait per us of compute before the collective
    coll_wait_launches: float | None = None  # the collective's wait that does not grow with that compute

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in ("launch_us", "intra_latency_us", "op_gap", "step_gap",
                                                          "coll_wait", "coll_wait_launches")
                             if getattr(self, k) is not None}
        if self.efficiency:
            d["efficiency"] = dict(self.efficiency)
        if self.classes:
            d["classes"] = {c: f.to_dict() for c, f in sorted(self.classes.items())}
        return d


@dataclass
class Resolved:
    """The calibration as it applies to one world size (what the cost model reads)."""

    classes: dict[str, ClassFit]
    op_gap: float = 0.0
    step_gap: float = 0.0
    coll_wait: float = 0.0
    coll_wait_launches: float = 0.0

    @property
    def empty(self) -> bool:
        return (not self.classes and not self.op_gap and not self.step_gap and not self.coll_wait
                and not self.coll_wait_launches)


@dataclass
class Calibration:
    """Per world size and pooled over worlds; see the module's table."""

    worlds: dict[int, WorldFit] = field(default_factory=dict)
    classes: dict[str, ClassFit] = field(default_factory=dict)  # pooled over the fit plans' worlds
    op_gap: float | None = None  # launches, every world without its own (older specs: `opgap`)

    def world(self, n: int) -> WorldFit:
        """The entry of world size n, created when missing."""
        return self.worlds.setdefault(int(n), WorldFit())

    def nearest(self, n: int) -> int | None:
        """The calibrated world size closest to n (the larger on a tie), None without any."""
        if not self.worlds:
            return None
        return min(self.worlds, key=lambda w: (abs(w - n), -w))

    def resolve(self, n: int) -> Resolved:
        """The class fits and host gaps that hold at n ranks (those of the nearest world)."""
        near = self.nearest(n)
        wf = self.worlds.get(near) if near is not None else None
        classes = dict(self.classes)
        if wf is not None:
            for c, f in wf.classes.items():
                classes[c] = classes[c].merged(f) if c in classes else f
        op_gap = wf.op_gap if wf is not None and wf.op_gap is not None else self.op_gap
        return Resolved(classes, float(op_gap or 0.0), float((wf.step_gap if wf else None) or 0.0),
                        float((wf.coll_wait if wf else None) or 0.0),
                        float((wf.coll_wait_launches if wf else None) or 0.0))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"worlds": {str(n): w.to_dict() for n, w in sorted(self.worlds.items())}}
        if self.classes:
            d["classes"] = {c: f.to_dict() for c, f in sorted(self.classes.items())}
        if self.op_gap is not None:
            d["op_gap"] = self.op_gap
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "calibration") -> Calibration:
        if not isinstance(d, Mapping):
            raise CalibrationSpecError(f"{where}: expected a mapping")
        _keys(d, ("worlds", "classes", "op_gap"), where)
        out = cls(classes=_classes(d.get("classes") or {}, f"{where}.classes"),
                  op_gap=_opt(d.get("op_gap"), f"{where}.op_gap"))
        worlds = d.get("worlds") or {}
        if not isinstance(worlds, Mapping):
            raise CalibrationSpecError(f"{where}.worlds: expected a mapping world size -> fit")
        for k, w in worlds.items():
            wh = f"{where}.worlds.{k}"
            if not str(k).isdigit() or int(k) < 1:
                raise CalibrationSpecError(f"{wh}: expected a positive world size as key")
            if not isinstance(w, Mapping):
                raise CalibrationSpecError(f"{wh}: expected a mapping")
            _keys(w, ("launch_us", "intra_latency_us", "efficiency", "classes", "op_gap", "step_gap", "coll_wait",
                      "coll_wait_launches"), wh)
            eff = w.get("efficiency") or {}
            if not isinstance(eff, Mapping):
                raise CalibrationSpecError(f"{wh}.efficiency: expected a mapping key -> factor")
            out.worlds[int(k)] = WorldFit(
                launch_us=_opt(w.get("launch_us"), f"{wh}.launch_us"),
                intra_latency_us=_opt(w.get("intra_latency_us"), f"{wh}.intra_latency_us"),
                efficiency={str(e): _pos(v, f"{wh}.efficiency.{e}") for e, v in eff.items()},
                classes=_classes(w.get("classes") or {}, f"{wh}.classes"),
                op_gap=_opt(w.get("op_gap"), f"{wh}.op_gap"), step_gap=_opt(w.get("step_gap"), f"{wh}.step_gap"),
                coll_wait=_opt(w.get("coll_wait"), f"{wh}.coll_wait"),
                coll_wait_launches=_opt(w.get("coll_wait_launches"), f"{wh}.coll_wait_launches"))
        return out


COLLECTIVE_CLASS = "#collective"  # class suffix of collective ops (a name may be either: opt/<pack>/cold_update)


def class_key(cls: str | None, collective: bool) -> str | None:
    """The key a class's coefficients are stored under: every collective in one class
    (they share the links and the gloo threads; a few fit plans seldom hold one exchange
    at enough sizes to fit it alone), apart from the compute ops."""
    return "comm" + COLLECTIVE_CLASS if collective else cls


# ----------------------------------------------------------------------------- old spec files

_WORLD_FIELDS = {"launch_us": "launch_us", "intra_latency_us": "intra_latency_us", "opgap": "op_gap",
                 "stepgap": "step_gap", "collwait": "coll_wait"}
_CLASS_FIELDS = (("lat:op:", "latency_scale"), ("opfixed:", "fixed_launches"), ("op:", "rate"))


def is_legacy_key(key: str) -> bool:
    """An `efficiency` key of the old string-key calibration (see from_legacy_efficiency)."""
    leaf = _split_world(key)[1]
    return leaf != key or leaf in ("opgap", "stepgap", "collwait") or leaf.startswith(("op:", "opfixed:", "lat:op:"))


def from_legacy_efficiency(eff: Mapping[str, float],
                           into: Calibration | None = None) -> tuple[dict[str, float], Calibration | None]:
    """Split an old spec's `efficiency` into its plain factors and a Calibration (`into`,
    changed in place, when given): `w{n}.<key>` (a world's launch_us, intra_latency_us, rate
    factors, class fits, opgap, stepgap, collwait), `op:<class>` (rate), `opfixed:<class>`
    (fixed launches), `lat:op:<class>` (latency scale), `opgap`."""
    plain: dict[str, float] = {}
    cal = into if into is not None else Calibration()
    found = into is not None
    for key, v in eff.items():
        world, leaf = _split_world(key)
        if world is None and not is_legacy_key(key):
            plain[key] = float(v)
            continue
        found = True
        cls_field = next(((leaf[len(p):], f) for p, f in _CLASS_FIELDS if leaf.startswith(p)), None)
        if cls_field is not None:
            classes = cal.classes if world is None else cal.world(world).classes
            setattr(classes.setdefault(cls_field[0], ClassFit()), cls_field[1], float(v))
        elif world is None:
            if leaf == "opgap":
                cal.op_gap = float(v)
            # "stepgap"/"collwait" without a world were never written; nothing reads them
        elif leaf in _WORLD_FIELDS:
            setattr(cal.world(world), _WORLD_FIELDS[leaf], float(v))
        else:
            cal.world(world).efficiency[leaf] = float(v)
    return plain, (cal if found else None)


def _split_world(key: str) -> tuple[int | None, str]:
    if key.startswith("w") and "." in key and key[1:key.index(".")].isdigit():
        return int(key[1:key.index(".")]), key[key.index(".") + 1:]
    return None, key


# ----------------------------------------------------------------------------- checks


def _keys(d: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    bad = sorted(set(d) - set(allowed))
    if bad:
        raise CalibrationSpecError(f"{where}: unknown key {bad[0]!r} (expected one of {', '.join(allowed)})")


def _pos(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v:
        raise CalibrationSpecError(f"{where}: expected a positive number, got {v!r}")
    return float(v)


def _opt(v: Any, where: str) -> float | None:
    return None if v is None else _pos(v, where)


def _classes(d: Any, where: str) -> dict[str, ClassFit]:
    if not isinstance(d, Mapping):
        raise CalibrationSpecError(f"{where}: expected a mapping class -> fit")
    out = {}
    for c, f in d.items():
        if not isinstance(f, Mapping):
            raise CalibrationSpecError(f"{where}.{c}: expected a mapping")
        _keys(f, ("fixed_launches", "rate", "latency_scale"), f"{where}.{c}")
        out[str(c)] = ClassFit(*(_opt(f.get(k), f"{where}.{c}.{k}") for k in ("fixed_launches", "rate",
                                                                               "latency_scale")))
    return out
