"""Cold rows a run really exchanged, per pack, beside what the plan predicted.

The planner sizes every exchange from access statistics: a measured profile, or an assumed
Zipf whose hot rows are the IDs 0..h-1. On data whose frequent IDs are elsewhere (hashed IDs,
another day's log, a profile of other data) the hot set misses, every lookup of those rows
travels, and the run is slower than planned with nothing saying why. The trainer counts, from
the sizes it exchanges anyway (no extra sync), the cold rows each rank sends per micro-batch
(a pooled exchange: its cold IDs) and the hot rows it reads locally; the run reports them
against Prediction.cold_per_mb and names a pack that exchanged far more than planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.volumes import fused_members

# a pack is named when it exchanged this much more than predicted, and at least MIN_EXTRA
# rows more per micro-batch (a few rows over a tiny prediction are noise, not a missed hot set)
OVER = 1.5
MIN_EXTRA = 64.0


@dataclass
class ExchangeCounts:
    """One rank's running sums per pack: cold rows sent, hot rows read, micro-batches sized."""

    sums: dict[str, list[float]] = field(default_factory=dict)

    def add(self, pack: str, cold: int, hot: int) -> None:
        s = self.sums.setdefault(pack, [0.0, 0.0, 0])
        s[0] += cold
        s[1] += hot
        s[2] += 1

    def per_mb(self) -> dict[str, tuple[float, float]]:
        """Per pack: (cold, hot) rows per micro-batch, the mean over what was sized."""
        return {p: (c / n, h / n) for p, (c, h, n) in self.sums.items() if n}


def exchange_report(per_rank: list[dict[str, tuple[float, float]]], predicted: dict[str, float],
                    assumed_access: bool, order: list[str] | None = None,
                    ) -> tuple[dict[str, dict[str, float]], str | None]:
    """(per pack: measured cold and hot rows per micro-batch and rank, the mean over ranks, with
    the prediction and their ratio where the plan has one; a one-line note naming the packs that
    exchanged over OVER times their prediction, else None). `assumed_access`: the plan's access
    statistics were assumed (no profile), which the note then says. A prediction for a fused
    run of packs, "first..last" (planner.volumes.fuse_table_wise, how TorchRec's plans are
    scored), is set beside the sum of those packs of `order` (the plan's packs, in order)."""
    mean = {}
    for p in sorted({p for r in per_rank for p in r}):
        got = [r[p] for r in per_rank if p in r]
        mean[p] = (sum(c for c, _ in got) / len(got), sum(h for _, h in got) / len(got))
    for name in predicted:
        members = fused_members(name, order or [])
        if members and all(m in mean for m in members):
            mean[name] = (sum(mean[m][0] for m in members), sum(mean[m][1] for m in members))
    out: dict[str, dict[str, float]] = {}
    over = []
    for p, (cold, hot) in mean.items():
        row = {"cold_per_mb": cold, "hot_per_mb": hot}
        want = predicted.get(p)
        if want is not None:
            row["predicted_cold_per_mb"] = want
            if want > 0:
                row["measured_over_predicted"] = cold / want
            if cold > OVER * want and cold - want >= MIN_EXTRA:
                over.append(f"{p} {cold:,.0f} against {want:,.0f}")
        out[p] = row
    if not over:
        return out, None
    why = ("the plan assumed its access statistics (no --profile): `picasso analyze` this data and plan "
           "with --profile" if assumed_access else
           "its hot rows miss this data's frequent IDs: re-profile the data (`picasso analyze`) and plan again")
    return out, (f"exchange: more cold rows per micro-batch and rank than the plan predicted ({'; '.join(over)}); "
                 f"{why}")
