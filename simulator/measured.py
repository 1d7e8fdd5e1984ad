"""Analyses of a measured Timeline: what calibration fits and validation compares.

A measured timeline comes from the executor (`Timeline` JSON, or a Chrome trace read back
with `load_timeline`); its events carry `step`. Here: dropping the warm-up steps,
collectives counted from when their lane is free (`service_durations`) and how long
they sat queued (`queue_delays`), mean op durations, the untimed host time between ops
(`host_gap`, which `simulator.calibration.fit_host_gaps` models), step spans, the median
step, and merging runs of one plan measured at different moments.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from foundation.documents import read_json
from simulator.timeline import Event, Timeline

COMM_LANE = "comm"
# the input pipeline's exchanges: a queue of their own (their own process group or stream)
INPUT_LANE = "input_dist"
INPUT_COPY_LANE = "input_copy"  # the next batch's copy to the device, on a stream of its own
# the dense gradients' buckets launched during the backward: a queue of their own (DDP's
# process group beside TorchRec's table-row-wise groups; a picasso plan's grad_bucket_mb)
BUCKET_LANE = "grad_buckets"
# ... and the step's last all-reduce of them (with the hot rows'), beside both
SYNC_LANE = "grad_sync"
# a fused pooled group's collectives inside the node and among peers: each process group is a
# queue of its own (executor.sparse.pooled_twrw.NodeGroups), so one micro-batch's exchange across
# nodes runs beside the next one's reduce inside the node
NODE_LANE = "node_group"
PEERS_LANE = "peers_group"
GROUP_LANES = {"node": NODE_LANE, "peers": PEERS_LANE}
# the lanes that queue collectives (every other lane is host-issued compute)
COLLECTIVE_LANES = (COMM_LANE, INPUT_LANE, BUCKET_LANE, SYNC_LANE, NODE_LANE, PEERS_LANE)
PASS_STEP_OFFSET = 1_000_000  # step numbers of run r are shifted by r times this when runs merge
PASS_TIME_OFFSET_US = 1e12  # ... and their times, so that no two runs' events overlap


def load_timeline(path: str | os.PathLike) -> Timeline:
    """A Timeline JSON, or a Chrome trace (traceEvents) turned back into a Timeline."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such timeline or trace")
    try:
        d = read_json(path, "timeline or trace")  # bounded in size, nesting and numbers; any BOM
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: a timeline or trace is not JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        return _timeline_from(d)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a timeline or trace ({type(exc).__name__}: {str(exc)[:120]})") from None


def _timeline_from(d: dict) -> Timeline:
    if "events" in d:
        return Timeline.from_dict(d)
    tl = Timeline(meta=dict(d.get("otherData", {})))
    lanes: dict[tuple[int, int], str] = {}
    for e in d.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lanes[(e["pid"], e["tid"])] = e["args"]["name"]
    for e in d.get("traceEvents", []):
        if e.get("ph") == "X":
            tl.add(int(e["pid"]), lanes.get((e["pid"], e["tid"]), str(e["tid"])), e["name"], float(e["ts"]),
                   float(e["dur"]), **dict(e.get("args", {})))
    return tl


def drop_warmup(tl: Timeline, warmup: int) -> Timeline:
    """Events of the timed steps only (events carry `step`; those without are kept)."""
    keep = [e for e in tl.events if int(e.args.get("step", warmup)) >= warmup]
    return Timeline(keep, dict(tl.meta))


def service_durations(tl: Timeline) -> list[tuple[Event, float]]:
    """(event, duration) with collectives counted from when their lane is free.

    A rank's collectives run one after another in launch order (gloo and NCCL queue them),
    so an exchange launched while another is in flight waits in the queue before it
    runs. Its span from launch to completion holds that wait; the simulator runs the comm
    lane in order too and starts an op when the previous one ends. On lane "comm" each
    event counts from max(its start, the end of the rank's previous comm event)."""
    return [(e, dur) for e, dur, _ in _lane_service(tl)]


def queue_delays(tl: Timeline) -> dict[str, list[float]]:
    """Per collective name (lane "comm"): per event, how long it sat in its rank's queue
    (from its launch to when the rank's previous comm event ended; 0 when the lane was
    free). A wait for slower ranks passes meanwhile: simulator.calibration fits it from
    the events that were not queued (or not for long)."""
    out: dict[str, list[float]] = defaultdict(list)
    for e, _, queued in _lane_service(tl):
        if e.lane == COMM_LANE:
            out[e.name].append(queued)
    return dict(out)


def _lane_service(tl: Timeline) -> list[tuple[Event, float, float]]:
    """(event, service duration, time queued): see service_durations."""
    out: list[tuple[Event, float, float]] = []
    comm: dict[int, list[Event]] = defaultdict(list)
    for e in tl.events:
        if e.lane == COMM_LANE:
            comm[e.rank].append(e)
        else:
            out.append((e, e.dur_us, 0.0))
    for evs in comm.values():
        busy = float("-inf")
        for e in sorted(evs, key=lambda e: (e.start_us, e.end_us)):
            out.append((e, max(e.end_us - max(e.start_us, busy), 0.0), max(busy - e.start_us, 0.0)))
            busy = max(busy, e.end_us)
    return out


def mean_op_durations(tl: Timeline) -> dict[str, float]:
    """Per op name: the mean over ranks of the per-step duration (summed within a step);
    collectives by `service_durations`."""
    acc: dict[tuple[str, int, int], float] = defaultdict(float)
    for e, dur in service_durations(tl):
        acc[(e.name, e.rank, int(e.args.get("step", 0)))] += dur
    per: dict[str, list[float]] = defaultdict(list)
    for (name, _r, _s), v in acc.items():
        per[name].append(v)
    return {k: float(np.mean(v)) for k, v in per.items()}


def host_gap(tl: Timeline) -> tuple[float, float]:
    """(median untimed host time per rank and step in us, mean compute ops per rank and
    step): a step's span on a rank less the union of its timed ops and collectives, i.e. the
    Python between ops and whatever the step does outside them (simulator.calibration.
    fit_host_gaps models it)."""
    by: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in tl.events:
        by[(e.rank, int(e.args.get("step", 0)))].append(e)
    gaps, ops = [], []
    for evs in by.values():
        evs.sort(key=lambda e: e.start_us)
        covered, cur_s, cur_e = 0.0, evs[0].start_us, evs[0].end_us
        for e in evs[1:]:
            if e.start_us > cur_e:
                covered += cur_e - cur_s
                cur_s, cur_e = e.start_us, e.end_us
            else:
                cur_e = max(cur_e, e.end_us)
        covered += cur_e - cur_s
        gaps.append(max(max(e.end_us for e in evs) - evs[0].start_us - covered, 0.0))
        ops.append(sum(1 for e in evs if e.lane not in COLLECTIVE_LANES))  # host-issued compute ops
    if not gaps:
        return 0.0, 0.0
    return float(np.median(gaps)), float(np.mean(ops))


def step_times_us(tl: Timeline) -> list[float]:
    """Per timed step: from the first op start to the last op end over all ranks."""
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    for e in tl.events:
        s = int(e.args.get("step", 0))
        lo[s] = min(lo.get(s, e.start_us), e.start_us)
        hi[s] = max(hi.get(s, e.end_us), e.end_us)
    return [hi[s] - lo[s] for s in sorted(lo)]


def one_step(tl: Timeline) -> Timeline:
    """The median timed step of a measured timeline (the Gantt of one iteration)."""
    steps = sorted({int(e.args.get("step", 0)) for e in tl.events})
    if not steps:
        return tl
    s = steps[len(steps) // 2]
    return Timeline([e for e in tl.events if int(e.args.get("step", 0)) == s], dict(tl.meta))


def merge_runs(timelines: list[Timeline]) -> Timeline:
    """One timeline from runs of the same plan at different moments: steps and times of
    run r shifted apart, so that no two runs' steps mix (op durations and host gaps then
    count every timed step of every run)."""
    if len(timelines) == 1:
        return timelines[0]
    events = []
    for r, tl in enumerate(timelines):
        for e in tl.events:
            args = dict(e.args)
            args["step"] = int(args.get("step", 0)) + r * PASS_STEP_OFFSET
            events.append(Event(e.rank, e.lane, e.name, e.start_us + r * PASS_TIME_OFFSET_US, e.dur_us, args))
    return Timeline(events, dict(timelines[0].meta))
