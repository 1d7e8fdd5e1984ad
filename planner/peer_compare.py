"""A plan against the systems users compare with (planner.peers), for `picasso plan --explain`.

Each peer is scored twice by the same simulator: its plan on its own engine (the traits of
planner.engines: what that system would run) and the same plan on picasso's engine (what the
search can reach: planner.search's peer_stage makes it a candidate). Their difference splits
the peer's distance to this plan into a part of plan (which tables where, which rows
replicated, which exchange) and a part of engine (the traits picasso's executor lacks or has),
and the ops whose time differs most say where.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner import op_names as on
from planner.access import TableAccess
from planner.engines import ENGINE_TRAITS, TRAITS, Engine
from planner.errors import PlanError
from planner.peers import PEERS, peer_plan
from planner.plan import Plan
from planner.search import Evaluation, evaluate, full_symmetry

if TYPE_CHECKING:  # types only
    from simulator.hardware import HardwareSpec


@dataclass
class PeerScore:
    name: str
    engine: str
    own_us: float | None  # its plan on its engine
    picasso_us: float | None  # its plan on picasso's engine
    problem: str | None = None
    plan_summary: str = ""
    traits: list[str] = field(default_factory=list)  # "trait: mechanism (source)"
    ops_own: dict[str, float] = field(default_factory=dict)  # busy us per op class, rank 0
    ops_picasso: dict[str, float] = field(default_factory=dict)


def op_busy(ev: Evaluation) -> dict[str, float]:
    """Busy microseconds per op class (packs alike) on the slowest lane's rank 0."""
    out: dict[str, float] = defaultdict(float)
    if ev.result is None:
        return {}
    for e in ev.result.timeline.events:
        if e.rank == 0:
            out[on.op_class(e.name)] += float(e.dur_us)
    return dict(out)


def score_peers(plan: Plan, hw: HardwareSpec, access: dict[str, TableAccess], engine: str = "simpy",
                peers: tuple[str, ...] = PEERS) -> list[PeerScore]:
    """Each peer's plan for `plan`'s model, ranks and batch, on its engine and on picasso's."""
    out = []
    for name in peers:
        try:
            bp = peer_plan(name, plan.model, plan.world_size, plan.batch_size_per_rank, hw, access)
        except PlanError as exc:
            out.append(PeerScore(name, "", None, None, problem=str(exc)))
            continue
        eng = Engine.from_str(bp.provenance.engine)
        own = evaluate(bp, hw, access, engine, full_symmetry(bp), name)
        bp.provenance.engine = None
        mine = evaluate(bp, hw, access, engine, full_symmetry(bp), name)
        out.append(PeerScore(name, eng.value, own.iteration_us, mine.iteration_us, own.problem or mine.problem,
                             _summary(bp), [f"{t.value}: {TRAITS[t].mechanism} ({TRAITS[t].source})"
                                            for t in ENGINE_TRAITS[eng]], op_busy(own), op_busy(mine)))
    return out


def _summary(plan: Plan) -> str:
    kinds = sorted({str(p.sharding) for p in plan.packs})
    hot = sum(plan.hot_rows.values())
    return (f"{len(plan.packs)} pack(s), {'/'.join(kinds)}, exchange {plan.exchange}"
            + (f", {hot:,} frequent rows replicated" if hot else ""))


def to_dicts(scores: list[PeerScore], mine_us: float | None) -> list[dict[str, Any]]:
    return [{"peer": s.name, "engine": s.engine, "own_engine_us": s.own_us, "picasso_engine_us": s.picasso_us,
             "speedup_over_own": s.own_us / mine_us if s.own_us and mine_us else None,
             "speedup_over_picasso_engine": s.picasso_us / mine_us if s.picasso_us and mine_us else None,
             "problem": s.problem, "plan": s.plan_summary, "traits": s.traits,
             "differs_most": _differs(s.ops_own, s.ops_picasso)} for s in scores]


def _differs(own: dict[str, float], mine: dict[str, float], most: int = 3) -> list[dict[str, float | str]]:
    """The op classes whose busy time the peer's engine changes most (its traits at work)."""
    keys = set(own) | set(mine)
    diff = sorted(((k, own.get(k, 0.0) - mine.get(k, 0.0)) for k in keys), key=lambda x: (-abs(x[1]), x[0]))
    return [{"op": k, "delta_us": d} for k, d in diff[:most] if abs(d) > 0.05]


def lines(scores: list[PeerScore], mine_us: float | None) -> list[str]:
    """The explanation's section on the peers: by how much, and why (plan, engine, ops)."""
    if not scores or not mine_us:
        return []
    out = ["against the systems users compare with (each peer's plan on its own engine, and on picasso's: the "
           "search has the latter among its candidates):"]
    for d in to_dicts(scores, mine_us):
        if d["own_engine_us"] is None or d["picasso_engine_us"] is None:
            out.append(f"  {d['peer']:12s} n/a ({d['problem']})")
            continue
        own, pic = d["own_engine_us"], d["picasso_engine_us"]
        out.append(f"  {d['peer']:12s} {own:10.1f} us on its engine -> this plan {own / mine_us:.2f}x; "
                   f"its plan on picasso's engine {pic:.1f} us -> {pic / mine_us:.2f}x  [{d['plan']}]")
        out.append(f"    plan: {_share(pic - mine_us)} of the difference; engine: {_share(own - pic)}")
        if d["differs_most"]:
            out.append("    its engine changes most: " + ", ".join(
                f"{x['op']} {x['delta_us']:+.1f} us" for x in d["differs_most"]))
        out += [f"    - {t}" for t in d["traits"]]
    return out


def _share(us: float) -> str:
    return f"{us:+.1f} us"
