"""Model presets. Cardinalities are the public per-feature counts of each data set."""

from __future__ import annotations

from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec

# Criteo Kaggle (Display Advertising Challenge), C1..C26: distinct values per feature
# as counted over the 7 training days (the figures used by the DLRM reference code).
CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
CRITEO_KAGGLE_ROWS = 45_840_617

# Criteo 1TB as hashed for MLPerf DLRM (max index range 40M).
CRITEO_1TB_CARDINALITIES = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346,
    10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)


def criteo_tables(cards: tuple[int, ...], dim: int, **kw) -> tuple[TableSpec, ...]:
    return tuple(TableSpec(name=f"C{i + 1}", num_rows=c, dim=dim, **kw) for i, c in enumerate(cards))


def dlrm_criteo_kaggle() -> ModelSpec:
    d = 16
    return ModelSpec(
        name="dlrm-criteo-kaggle",
        arch="dlrm",
        num_dense=13,
        tables=criteo_tables(CRITEO_KAGGLE_CARDINALITIES, d),
        bottom_mlp=(512, 256, d),
        top_mlp=(512, 256, 1),
        interaction="dot",
    )


def dlrm_mlperf() -> ModelSpec:
    d = 128
    return ModelSpec(
        name="dlrm-mlperf",
        arch="dlrm",
        num_dense=13,
        tables=criteo_tables(CRITEO_1TB_CARDINALITIES, d),
        bottom_mlp=(512, 256, d),
        top_mlp=(1024, 1024, 512, 256, 1),
        interaction="dot",
    )


PRESETS = {
    "dlrm-criteo-kaggle": dlrm_criteo_kaggle,
    "dlrm-mlperf": dlrm_mlperf,
}


def get_model(name: str) -> ModelSpec:
    """A preset by name (see PRESETS)."""
    try:
        spec = PRESETS[name]()
    except KeyError:
        raise PlanError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
    spec.validate()
    return spec
