"""OpGraph: the operators of one training iteration on every rank, and their dependencies.

A node is one op on one rank (id `f"{rank}:{name}"`), on a lane (a stream: "compute", "comm",
"copy", "host" ...). Ops of one lane run one at a time in the order they were added (like a
CUDA stream). An op demands resources (FLOPs, HBM/host/PCIe/NIC bytes) or is one rank's part
of a collective; the parts of one collective are the ops with the same name and group on the
ranks of the group, and they start together.

Symmetric graphs hold representative ranks only: rank r stands for `rank_weights[r]` identical
ranks. Collectives keep their full group (costs use the full group size) but synchronise only
among the held ranks.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from foundation.documents import read_json
from foundation.files import atomic_write_text

COLLECTIVE_TYPES = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter", "broadcast")
ALGORITHMS = (None, "ring", "tree", "hierarchical", "direct")
DEMANDS = ("flops", "hbm_bytes", "host_bytes", "pcie_bytes", "nic_bytes")
FORMAT_VERSION = 1
_DEMAND_NAMES = ("flops", "hbm_bytes", "host_bytes", "pcie_bytes", "nic_bytes", "mem_alloc", "mem_free")
_INT_COLUMNS = ("rank", "lane", "dtype", "eff_key", "coll", "cls")
_COLUMNS = ("rank", "lane", "dtype", "eff_key", "coll", "cls", "launch", "fixed_us", "lat_steps", "fixed_hbm_bytes",
            "run_bytes", "span_bytes", "table_bytes",
            "flops", "hbm_bytes", "host_bytes", "pcie_bytes", "nic_bytes", "mem_alloc", "mem_free")
_CODED = ("lane", "dtype", "eff_key", "coll", "cls")


class OpGraphError(ValueError):
    """A malformed graph: cycle, unknown op, bad demand, collective mismatch. One line."""


@dataclass(frozen=True)
class Collective:
    """One rank's view of a collective. bytes_per_rank: all_reduce/reduce_scatter/broadcast:
    the buffer size; all_gather: each rank's contribution; all_to_all: the rank's whole send
    buffer (a 1/p slice of it goes to each rank, itself included)."""

    type: str
    group: tuple[int, ...]
    bytes_per_rank: float
    algorithm: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "group", tuple(int(r) for r in self.group))
        if self.type not in COLLECTIVE_TYPES:
            raise OpGraphError(f"collective type {self.type!r}: expected one of {', '.join(COLLECTIVE_TYPES)}")
        if not self.group or len(set(self.group)) != len(self.group):
            raise OpGraphError(f"collective group {self.group!r}: expected distinct ranks, at least one")
        if not self.bytes_per_rank >= 0:
            raise OpGraphError(f"collective bytes_per_rank {self.bytes_per_rank!r}: expected >= 0")
        if self.algorithm not in ALGORITHMS:
            raise OpGraphError(f"collective algorithm {self.algorithm!r}: expected one of {ALGORITHMS[1:]} or None")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "group": list(self.group), "bytes_per_rank": self.bytes_per_rank,
                "algorithm": self.algorithm}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Collective:
        return cls(d["type"], tuple(d["group"]), float(d["bytes_per_rank"]), d.get("algorithm"))


class OpGraph:
    """A networkx DiGraph of ops (`self.g`); node attributes are the op's fields."""

    def __init__(self, world_size: int, symmetric: bool = False, rank_weights: dict[int, int] | None = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise OpGraphError(f"world_size: expected a positive integer, got {world_size!r}")
        self.world_size = world_size
        self.symmetric = bool(symmetric)
        self._rank_weights = {int(r): int(w) for r, w in (rank_weights or {}).items()}
        for r, w in self._rank_weights.items():
            if not (0 <= r < world_size) or w < 1:
                raise OpGraphError(f"rank_weights[{r}] = {w}: expected a rank in [0, {world_size}) and weight >= 1")
        if self._rank_weights and sum(self._rank_weights.values()) > world_size:
            raise OpGraphError(f"rank_weights sum to {sum(self._rank_weights.values())} > world_size {world_size}")
        import networkx as nx  # here: its import costs every process 0.1 s, and ranks build no graph

        self.g = nx.DiGraph()
        self.meta: dict[str, Any] = {}
        # Columns kept alongside the networkx graph so engines compile without walking it.
        # Ops and edges must therefore be added through add_op/add_dep only.
        self._ids: list[str] = []
        self._idx: dict[str, int] = {}
        # typed arrays: numpy reads them without conversion (np.frombuffer)
        self._cols: dict[str, array] = {k: array("q" if k in _INT_COLUMNS else "d") for k in _COLUMNS}
        self._codes: dict[str, dict[Any, int]] = {k: {} for k in _CODED}
        self._coll_info: list[tuple[Collective, Any]] = []  # per collective code: (Collective, eff_key) of its first op
        self._esrc = array("q")
        self._edst = array("q")
        self._version = 0  # bumped on every change; engines cache compiled structure per version
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------ building
    def add_op(self, name: str, rank: int, lane: str, kind: str = "compute", *, flops: float = 0.0,
               hbm_bytes: float = 0.0, host_bytes: float = 0.0, pcie_bytes: float = 0.0, nic_bytes: float = 0.0,
               dtype: str = "fp32", collective: Collective | None = None, mem_alloc: float = 0.0,
               mem_free: float = 0.0, deps: Iterable[str] = (), **args: Any) -> str:
        """Add one op; returns its id `f"{rank}:{name}"`. `args` are free annotations; engines read
        `eff_key` (efficiency factor), `launch` (kernels it launches: a count; False: none), `cls` (the op's class,
        whose calibrated coefficients the cost model applies), and the demands of its fixed part:
        `lat_steps` (link latencies it pays besides its collective algorithm's), `fixed_hbm_bytes`
        (memory bytes it moves at the memory rate outside its flow), `run_bytes` (bytes one
        parallel unit streams alone) and `fixed_us` (plain time); `span_bytes`, the memory its
        random rows are spread over, and `table_bytes`, how many of its memory bytes are those rows
        (the TLB's share of misses: simulator.device_perf)."""
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise OpGraphError(f"op {name!r}: rank {rank!r} outside [0, {self.world_size})")
        if self.symmetric and self._rank_weights and rank not in self._rank_weights:
            raise OpGraphError(f"op {name!r}: rank {rank} is not a representative rank (rank_weights)")
        nid = f"{rank}:{name}"
        if nid in self._idx:
            raise OpGraphError(f"op {nid!r} added twice")
        vals = (flops, hbm_bytes, host_bytes, pcie_bytes, nic_bytes, mem_alloc, mem_free)
        try:
            ok = min(vals) >= 0 and not any(isinstance(v, bool) for v in vals)  # False for NaN too
        except TypeError:
            ok = False
        if not ok:
            for k, v in zip(_DEMAND_NAMES, vals):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                    raise OpGraphError(f"op {nid!r}: {k} = {v!r}, expected a number >= 0")
        if collective is not None:
            if isinstance(collective, dict):
                collective = Collective.from_dict(collective)
            if rank not in collective.group:
                raise OpGraphError(f"op {nid!r}: rank {rank} not in its collective group {collective.group}")
            if max(collective.group) >= self.world_size:
                raise OpGraphError(f"op {nid!r}: collective group has rank >= world_size {self.world_size}")
            kind = "collective"
        lane = str(lane)
        self.g.add_node(nid, name=name, rank=rank, lane=lane, kind=kind, dtype=dtype, collective=collective,
                        args=args, flops=flops, hbm_bytes=hbm_bytes, host_bytes=host_bytes, pcie_bytes=pcie_bytes,
                        nic_bytes=nic_bytes, mem_alloc=mem_alloc, mem_free=mem_free)
        self._idx[nid] = len(self._ids)
        self._ids.append(nid)
        self._append_columns(self.g.nodes[nid])
        for d in deps:
            self.add_dep(d, nid)
        self._changed()
        return nid

    def add_dep(self, before: str, after: str) -> None:
        idx = self._idx
        if before not in idx or after not in idx:
            x = before if before not in idx else after
            raise OpGraphError(f"dependency {before!r} -> {after!r}: unknown op {x!r}")
        if before == after:
            raise OpGraphError(f"dependency {before!r} -> {after!r}: an op cannot depend on itself")
        if not self.g.has_edge(before, after):
            self.g.add_edge(before, after)
            self._esrc.append(self._idx[before])
            self._edst.append(self._idx[after])
        self._changed()

    def _append_columns(self, a: dict[str, Any]) -> None:
        codes, cols = self._codes, self._cols
        cols["rank"].append(a["rank"])
        lc = codes["lane"]
        cols["lane"].append(lc.setdefault(a["lane"], len(lc)))
        dc = codes["dtype"]
        cols["dtype"].append(dc.setdefault(a["dtype"], len(dc)))
        args = a["args"] or {}
        ec = codes["eff_key"]
        cols["eff_key"].append(ec.setdefault(args.get("eff_key"), len(ec)))
        n = args.get("launch", True)  # kernels the op launches (True: one, False: none)
        cols["launch"].append(float(n))
        cc = codes["cls"]
        cols["cls"].append(cc.setdefault(args.get("cls"), len(cc)))
        for k in ("fixed_us", "lat_steps", "fixed_hbm_bytes", "run_bytes", "span_bytes", "table_bytes"):
            cols[k].append(float(args.get(k, 0.0)) if args else 0.0)
        c = a["collective"]
        if c is None:
            cols["coll"].append(-1)
        else:
            cc = codes["coll"]
            n_cc = len(cc)
            code = cc.setdefault((a["name"], c.group), n_cc)
            if code == n_cc:
                self._coll_info.append((c, args.get("eff_key")))
            cols["coll"].append(code)
        for k in _DEMAND_NAMES:
            cols[k].append(a[k])

    def _changed(self) -> None:
        self._version += 1
        if self._cache:
            self._cache.clear()

    def _touch(self) -> None:
        """Call after editing op attributes in place (e.g. `args["eff_key"]`): the engines'
        columns are read again from the node attributes."""
        self._cols = {k: array("q" if k in _INT_COLUMNS else "d") for k in _COLUMNS}
        self._codes = {k: {} for k in _CODED}
        self._coll_info = []
        nodes = self.g.nodes
        for nid in self._ids:
            self._append_columns(nodes[nid])
        self._changed()

    refresh = _touch

    # ------------------------------------------------------------------ reading
    def ops(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(id, attributes) in insertion order."""
        return iter(self.g.nodes(data=True))

    def op(self, op_id: str) -> dict[str, Any]:
        return self.g.nodes[op_id]

    def __len__(self) -> int:
        return self.g.number_of_nodes()

    def __contains__(self, op_id: object) -> bool:
        return op_id in self.g

    def ranks(self) -> list[int]:
        """The ranks held in the graph (representatives when symmetric)."""
        if self.symmetric and self._rank_weights:
            return sorted(self._rank_weights)
        rank = self._cols["rank"]
        if not len(rank):
            return []
        present = np.bincount(np.frombuffer(rank, np.int64), minlength=self.world_size)
        return np.flatnonzero(present).tolist()

    @property
    def rank_weights(self) -> dict[int, int]:
        """How many ranks each held rank stands for (1 each unless symmetric)."""
        held = self.ranks()
        if not self.symmetric:
            return {r: 1 for r in held}
        if self._rank_weights:
            return dict(self._rank_weights)
        w, extra = divmod(self.world_size, max(len(held), 1))
        return {r: w + (1 if i < extra else 0) for i, r in enumerate(held)}

    def collectives(self) -> dict[tuple[str, tuple[int, ...]], list[str]]:
        """(name, group) -> the op ids that take part (held ranks only)."""
        out: dict[tuple[str, tuple[int, ...]], list[str]] = {}
        for nid, a in self.g.nodes(data=True):
            c = a["collective"]
            if c is not None:
                out.setdefault((a["name"], c.group), []).append(nid)
        return out

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise OpGraphError naming a cycle or a collective whose held ranks do not all take part."""
        import networkx as nx

        try:
            cyc = nx.find_cycle(self.g)
        except nx.NetworkXNoCycle:
            cyc = None
        if cyc:
            path = " -> ".join([u for u, _ in cyc] + [cyc[0][0]])
            raise OpGraphError(f"dependency cycle: {path}")
        held = set(self.ranks())
        for (name, group), members in self.collectives().items():
            first = self.g.nodes[members[0]]["collective"]
            have = {self.g.nodes[m]["rank"] for m in members}
            missing = sorted((set(group) & held) - have)
            if missing:
                raise OpGraphError(f"collective {name!r} (group {list(group)[:8]}...): rank {missing[0]} has no op {name!r}")
            for m in members[1:]:
                c = self.g.nodes[m]["collective"]
                if (c.type, c.bytes_per_rank, c.algorithm) != (first.type, first.bytes_per_rank, first.algorithm):
                    raise OpGraphError(f"collective {name!r}: op {m!r} disagrees with {members[0]!r} on type/bytes/algorithm")
            if not self.symmetric and len(members) != len(group):
                raise OpGraphError(f"collective {name!r}: group has {len(group)} ranks but {len(members)} ops")

    # ------------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        ops = []
        for nid, a in self.g.nodes(data=True):
            d = {k: v for k, v in a.items() if k != "collective"}
            d["collective"] = a["collective"].to_dict() if a["collective"] is not None else None
            d["deps"] = list(self.g.predecessors(nid))
            ops.append(d)
        return {"version": FORMAT_VERSION, "world_size": self.world_size, "symmetric": self.symmetric,
                "rank_weights": {str(k): v for k, v in self._rank_weights.items()}, "meta": self.meta, "ops": ops}

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "opgraph") -> OpGraph:
        try:
            g = cls(int(d["world_size"]), bool(d.get("symmetric", False)),
                    {int(k): int(v) for k, v in (d.get("rank_weights") or {}).items()})
            ops = d["ops"]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise OpGraphError(f"{where}: malformed op graph JSON header ({type(e).__name__}: {e})") from None
        g.meta = dict(d.get("meta", {}))
        pending = []
        for i, o in enumerate(ops):
            try:
                o = dict(o)
                deps = o.pop("deps", [])
                coll = o.pop("collective", None)
                args = o.pop("args", {})
                nid = g.add_op(o.pop("name"), int(o.pop("rank")), o.pop("lane"), o.pop("kind", "compute"),
                               collective=Collective.from_dict(coll) if coll else None, **o, **args)
            except (KeyError, TypeError) as e:
                raise OpGraphError(f"{where}: ops[{i}]: malformed op ({type(e).__name__}: {e})") from None
            pending.extend((dep, nid) for dep in deps)
        for before, after in pending:
            g.add_dep(before, after)
        return g

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: str | os.PathLike) -> OpGraph:
        try:
            d = read_json(path, "operator graph")  # bounded in size, nesting and numbers; any BOM
        except json.JSONDecodeError as e:
            raise OpGraphError(f"{path}: not valid JSON (line {e.lineno}): {e.msg}") from None
        return cls.from_json(d, str(path))
