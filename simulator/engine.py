"""simulate(): run an OpGraph on a HardwareSpec with one of the two engines."""

from __future__ import annotations

import gc

from simulator.compiled import costs, structure
from simulator.hardware import HardwareSpec
from simulator.opgraph import OpGraph, OpGraphError
from simulator.result import SimResult

ENGINES = ("fast", "simpy")


def simulate(graph: OpGraph, hw: HardwareSpec, engine: str = "fast") -> SimResult:
    """Predict one iteration of `graph` on `hw`. engine "fast" (list scheduling, for search) or
    "simpy" (discrete events with flow-level fair sharing of every resource)."""
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if graph.world_size > hw.world_size:
        raise OpGraphError(f"graph has {graph.world_size} ranks but hardware {hw.name} has {hw.world_size}")
    st = structure(graph)
    c = costs(st, hw)
    if engine == "fast":
        from simulator.fast import schedule
    else:
        from simulator.des import schedule
    was_enabled = gc.isenabled()
    gc.disable()  # the engines allocate many short-lived objects and no cycles: skip collector passes
    try:
        start, end = schedule(st, c)
    except OpGraphError:
        graph.validate()  # names a dependency cycle when there is one
        raise
    finally:
        if was_enabled:
            gc.enable()
    it = float(end.max() - min(start.min(), 0.0)) if len(end) else 0.0
    return SimResult(iteration_us=it, engine=engine, start_us=start, end_us=end, st=st, costs=c, hardware=hw.name)
