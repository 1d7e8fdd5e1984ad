"""Model presets and model-spec files.

Cardinalities are the public per-feature counts of each data set. Every preset is
deterministic: the large synthetic `meta-856` model draws its shapes from a seeded
generator, so the same name always gives the same model.

`get_model(name_or_path)` accepts a preset name or a YAML/JSON model-spec file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from foundation.documents import DocumentError, read_spec
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

# MLPerf DLRM-DCNv2 on Criteo 1TB multi-hot: IDs per sample of C1..C26 (MLPerf training
# reference, the synthetic multi-hot Criteo of the v3.0+ benchmark).
CRITEO_MULTIHOT_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)

# Default skew of the profile-less fallback (planner.access.ZipfAccess): Zipf(1.05) per
# table, close to what click logs show (Criteo's categorical features fit 1.0-1.2).
DEFAULT_ZIPF_ALPHA = 1.05


def criteo_tables(cards: tuple[int, ...], dim: int, prefix: str = "C", **kw: Any) -> tuple[TableSpec, ...]:
    return tuple(TableSpec(name=f"{prefix}{i + 1}", num_rows=c, dim=dim, **kw) for i, c in enumerate(cards))


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


def dlrm_dcnv2() -> ModelSpec:
    """MLPerf DLRM-DCNv2: 26 tables of dim 128 (40M-capped hashed Criteo 1TB cardinalities)
    with multi-hot bags, bottom MLP 512-256-128, a low-rank DCNv2 cross network (3 layers,
    rank 512) over [bottom output, embeddings], top MLP 1024-1024-512-256-1, Adagrad
    (row-wise on the tables, plain on the dense layers)."""
    d = 128
    tables = tuple(TableSpec(name=f"C{i + 1}", num_rows=c, dim=d, optimizer="rowwise_adagrad",
                             pooling_factor=float(m))
                   for i, (c, m) in enumerate(zip(CRITEO_1TB_CARDINALITIES, CRITEO_MULTIHOT_SIZES)))
    return ModelSpec(
        name="dlrm-dcnv2",
        arch="dcn",
        num_dense=13,
        tables=tables,
        bottom_mlp=(512, 256, d),
        top_mlp=(1024, 1024, 512, 256, 1),
        interaction="cross",
        # Adagrad at a small learning rate, of the order MLPerf's reference uses (0.004)
        extra={"cross_layers": 3, "cross_rank": 512, "dense_optimizer": "adagrad", "lr": 0.004},
    )


def deepfm_criteo() -> ModelSpec:
    """DeepFM (Guo et al., 2017) on Criteo Kaggle: FM over the field embeddings + a deep MLP."""
    d = 10
    return ModelSpec(
        name="deepfm-criteo",
        arch="deepfm",
        num_dense=13,
        tables=criteo_tables(CRITEO_KAGGLE_CARDINALITIES, d),
        bottom_mlp=(),
        top_mlp=(400, 400, 400, 1),
        interaction="fm",
    )


def dcn_v2_criteo() -> ModelSpec:
    """DCN-v2 (Wang et al., 2021) on Criteo Kaggle: 3 full-rank cross layers beside a deep tower."""
    d = 16
    return ModelSpec(
        name="dcn-v2-criteo",
        arch="dcn",
        num_dense=13,
        tables=criteo_tables(CRITEO_KAGGLE_CARDINALITIES, d),
        bottom_mlp=(),
        top_mlp=(1024, 1024, 1),
        interaction="cross",
        extra={"cross_layers": 3},
    )


def wide_deep_criteo() -> ModelSpec:
    """Wide & Deep (Cheng et al., 2016): 1-wide linear tables (wide part) beside 32-wide deep tables.

    The two groups differ in dim and optimizer, so packing yields two kinds of packs.
    """
    deep = criteo_tables(CRITEO_KAGGLE_CARDINALITIES, 32, prefix="C")
    wide = criteo_tables(CRITEO_KAGGLE_CARDINALITIES, 1, prefix="W", optimizer="rowwise_adagrad", initializer="zeros")
    return ModelSpec(
        name="wide-deep-criteo",
        arch="wide_deep",
        num_dense=13,
        tables=deep + wide,
        bottom_mlp=(),
        top_mlp=(1024, 512, 256, 1),
        interaction="cat",
        extra={"wide_tables": [t.name for t in wide]},
    )


def din_taobao() -> ModelSpec:
    """DIN (Zhou et al., 2018), shaped after the Taobao user-behaviour data set.

    The behaviour sequences (items and categories a user clicked) are kept per item
    (pooling "none") for the attention unit, about 150 IDs per sample, up to 200.
    """
    d = 32
    seq = {"pooling": "none", "max_len": 200, "pooling_factor": 150.0}
    tables = (
        TableSpec("user_id", 987_994, d),
        TableSpec("item_id", 4_162_024, d),
        TableSpec("cate_id", 9_439, d),
        TableSpec("shop_id", 1_000_000, d),
        TableSpec("hist_item_id", 4_162_024, d, **seq),
        TableSpec("hist_cate_id", 9_439, d, **seq),
    )
    return ModelSpec(
        name="din-taobao",
        arch="din",
        num_dense=0,
        tables=tables,
        bottom_mlp=(),
        top_mlp=(200, 80, 1),
        interaction="attention",
        extra={"attention_mlp": [80, 40], "query": {"hist_item_id": "item_id", "hist_cate_id": "cate_id"}},
    )


# Meta dlrm_datasets 2021 (fbgemm_t856, batch 65,536): 887,017,990 indices and 128,435,723
# unique rows per batch over 856 tables, i.e. ~15.8 lookups per table per sample.
META_TABLES = 856
META_MEAN_POOLING = 887_017_990 / (856 * 65_536)


def meta_856() -> ModelSpec:
    """A large synthetic model shaped after Meta's dlrm_datasets 2021 statistics (856 tables).

    The statistics give totals, not per-table shapes; per-table shapes are drawn from a
    fixed seed: cardinalities log-uniform in [1e3, 4e7], pooling log-normal scaled to the
    measured mean of ~15.8 IDs per table per sample, dim 64, half fp16 and half fp32
    (two packing groups), row-wise Adagrad.
    """
    rng = np.random.default_rng(856)
    rows = np.exp(rng.uniform(math.log(1e3), math.log(4e7), META_TABLES)).astype(np.int64)
    pooling = rng.lognormal(0.0, 1.2, META_TABLES)
    pooling = np.clip(pooling * (META_MEAN_POOLING / pooling.mean()), 1.0, 400.0)
    dtypes = np.where(rng.random(META_TABLES) < 0.5, "fp16", "fp32")
    tables = tuple(
        TableSpec(
            name=f"t{i}", num_rows=int(rows[i]), dim=64, dtype=str(dtypes[i]),
            optimizer="rowwise_adagrad", pooling_factor=round(float(pooling[i]), 2),
        )
        for i in range(META_TABLES)
    )
    return ModelSpec(
        name="meta-856",
        arch="dlrm",
        num_dense=512,
        tables=tables,
        bottom_mlp=(512, 256, 64),
        top_mlp=(1024, 1024, 512, 256, 1),
        interaction="dot",
    )


PRESETS = {
    "dlrm-criteo-kaggle": dlrm_criteo_kaggle,
    "dlrm-mlperf": dlrm_mlperf,
    "dlrm-dcnv2": dlrm_dcnv2,
    "deepfm": deepfm_criteo,
    "dcn-v2": dcn_v2_criteo,
    "wide-deep": wide_deep_criteo,
    "din": din_taobao,
    "meta-856": meta_856,
}


def get_model(name: str) -> ModelSpec:
    """A preset by name (see PRESETS), or a model-spec file (.yaml, .yml or .json)."""
    if name in PRESETS:
        spec = PRESETS[name]()
        spec.validate()
        return spec
    if Path(name).suffix.lower() in (".yaml", ".yml", ".json") or Path(name).is_file():
        return load_model_file(name)
    raise PlanError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))} (or a .yaml file)")


def load_model_file(path: str | Path) -> ModelSpec:
    """A ModelSpec from YAML or JSON. `table_defaults` fills fields the tables leave out.

    Example::

        name: my-dlrm
        arch: dlrm
        num_dense: 13
        bottom_mlp: [64, 16]
        top_mlp: [64, 1]
        table_defaults: {dim: 16, optimizer: sgd}
        tables:
          - {name: user, num_rows: 100000}
          - {name: item, num_rows: 50000, pooling_factor: 3}
    """
    path = Path(path)
    try:
        d = read_spec(path, "model-spec file")  # bounded: size, nesting, aliases, tags
    except (OSError, DocumentError) as exc:
        raise PlanError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - yaml and json syntax errors come in many kinds; one line
        raise PlanError(f"{path}: cannot parse model spec: {str(exc).splitlines()[0]}") from None
    if not isinstance(d, dict):
        raise PlanError(f"{path}: expected a mapping with name, arch, num_dense, tables")
    defaults = d.pop("table_defaults", {}) or {}
    tables = d.get("tables")
    if not isinstance(tables, list) or not tables:
        raise PlanError(f"{path}: field 'tables' must be a non-empty list")
    known = set(TableSpec.__dataclass_fields__)
    merged = []
    for i, t in enumerate(tables):
        if not isinstance(t, dict):
            raise PlanError(f"{path}: tables[{i}] must be a mapping")
        t = {**defaults, **t}
        unknown = set(t) - known
        if unknown:
            raise PlanError(f"{path}: tables[{i}]: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        for req in ("name", "num_rows", "dim"):
            if req not in t:
                raise PlanError(f"{path}: tables[{i}]: missing field {req!r}")
        merged.append(t)
    d["tables"] = merged
    try:
        return ModelSpec.from_dict(d, where="")
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None
