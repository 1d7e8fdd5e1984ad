"""Model specifications: embedding tables plus the dense architecture, as dataclasses.

Specs are plain data: the planner lowers them to operator graphs and the executor builds
the torch model from them. Presets live in `planner.presets`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from foundation import fields
from foundation.fields import FieldError
from planner.errors import PlanError
from planner.modes import DenseDtype

ARCHS = ("dlrm", "deepfm", "dcn", "wide_deep", "din")
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
POOLINGS = ("sum", "mean", "none")
OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
# optimizer state a table keeps, in fp32: (floats per row, floats per element): row-wise Adagrad one
# accumulator per row; Adagrad one per element; Adam two moments per element (its step count is global)
OPTIMIZER_STATE = {"sgd": (0, 0), "rowwise_adagrad": (1, 0), "adagrad": (0, 1), "adam": (0, 2)}
# per-element state: no kernel fuses these into the backward; the executor updates their rows with
# torch ops (executor.sparse.row_optimizers), so many more kernels per update
PER_ELEMENT_OPTIMIZERS = ("adagrad", "adam")


def optimizer_state_bytes(optimizer: str, dim: int) -> int:
    """Bytes of optimizer state one row of `dim` elements keeps under `optimizer`."""
    per_row, per_element = OPTIMIZER_STATE.get(optimizer, (0, 0))
    return 4 * (per_row + per_element * dim)
INITIALIZERS = ("uniform", "normal", "zeros")


@dataclass(frozen=True)
class TableSpec:
    """One embedding table, looked up by the categorical feature of the same name."""

    name: str
    num_rows: int
    dim: int
    dtype: str = "fp32"
    pooling: str = "sum"  # "none": a sequence feature kept per item (DIN attention)
    optimizer: str = "sgd"
    initializer: str = "uniform"
    pooling_factor: float = 1.0  # mean IDs per sample when no profile says otherwise
    max_len: int = 1  # longest bag the model accepts for pooling "none"

    @property
    def bytes_per_row(self) -> int:
        return self.dim * DTYPES[self.dtype]

    @property
    def state_bytes(self) -> int:
        """Optimizer state per row (OPTIMIZER_STATE)."""
        return optimizer_state_bytes(self.optimizer, self.dim)

    def attributes(self) -> tuple:
        """What must be equal for two tables to share one packed table (PICASSO packing)."""
        return (self.dim, self.dtype, self.optimizer, self.initializer, self.pooling)

    def validate(self) -> None:
        if self.num_rows <= 0 or self.dim <= 0:
            raise PlanError(f"table {self.name}: num_rows and dim must be positive")
        for value, allowed, what in (
            (self.dtype, DTYPES, "dtype"),
            (self.pooling, POOLINGS, "pooling"),
            (self.optimizer, OPTIMIZERS, "optimizer"),
            (self.initializer, INITIALIZERS, "initializer"),
        ):
            if value not in allowed:
                raise PlanError(f"table {self.name}: {what} {value!r} is not one of {sorted(allowed)}")


@dataclass(frozen=True)
class ModelSpec:
    """A wide-and-deep model: dense input width, tables and the dense architecture."""

    name: str
    arch: str
    num_dense: int
    tables: tuple[TableSpec, ...]
    bottom_mlp: tuple[int, ...] = ()
    top_mlp: tuple[int, ...] = ()
    interaction: str = "dot"
    extra: dict[str, Any] = field(default_factory=dict)  # arch-specific knobs (cross layers, ...)
    # the dense layers' precision; None: not asked (planner.dense.with_dense_dtype gives a plan
    # the hardware's default), read through `dense_precision`
    dense_dtype: DenseDtype | None = None

    def __post_init__(self) -> None:
        # specs and plans written before the field carry the precision in extra: taken from there
        if "dense_dtype" in self.extra:
            extra = dict(self.extra)
            object.__setattr__(self, "dense_dtype", extra.pop("dense_dtype"))
            object.__setattr__(self, "extra", extra)
        if isinstance(self.dense_dtype, str) and self.dense_dtype in DenseDtype.values():
            object.__setattr__(self, "dense_dtype", DenseDtype(self.dense_dtype))  # else kept for the check

    @property
    def dense_precision(self) -> DenseDtype:
        """The precision the dense layers run at: the one asked for, fp32 when none was (plans
        written before the hardware's default was recorded)."""
        want = DenseDtype.FP32 if self.dense_dtype is None else self.dense_dtype
        if want not in DenseDtype.values():
            raise PlanError(f"model {self.name}: dense_dtype {want!r} is not one of {list(DenseDtype.values())}")
        return DenseDtype(want)

    def table(self, name: str) -> TableSpec:
        t = self._by_name.get(name)
        if t is None:
            raise PlanError(f"unknown table {name!r} in model {self.name}")
        return t

    @cached_property
    def _by_name(self) -> dict[str, TableSpec]:
        # first occurrence wins, as the former linear scan did (validate() rejects duplicates)
        out: dict[str, TableSpec] = {}
        for t in self.tables:
            out.setdefault(t.name, t)
        return out

    @property
    def table_names(self) -> list[str]:
        return [t.name for t in self.tables]

    def with_row_cap(self, cap: int) -> ModelSpec:
        """The same model with every table capped at `cap` rows (IDs hash modulo rows)."""
        tables = tuple(replace(t, num_rows=min(t.num_rows, cap)) for t in self.tables)
        return replace(self, name=f"{self.name}@cap{cap}", tables=tables)

    # The dense architecture's settings in `extra`, with their defaults in one place: the
    # planner costs (planner.dense) the layers the executor builds (executor.dense.model).
    @property
    def cross_layers(self) -> int:
        """DCN: cross layers (3, as DCN-v2 and MLPerf's DLRM-DCNv2)."""
        return int(self.extra.get("cross_layers", 3))

    @property
    def cross_rank(self) -> int:
        """DCN: rank of each cross layer's W = U V (0: full rank)."""
        return int(self.extra.get("cross_rank", 0))

    @property
    def attention_mlp(self) -> list[int]:
        """DIN: hidden sizes of the attention unit's MLP ([80, 40], as the DIN paper)."""
        return [int(x) for x in self.extra.get("attention_mlp", [80, 40])]

    @property
    def wide_tables(self) -> list[str]:
        """Wide&Deep: the tables of the wide part (default: the tables of dim 1)."""
        return list(self.extra.get("wide_tables", [t.name for t in self.tables if t.dim == 1]))

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise PlanError(f"model {self.name}: arch {self.arch!r} is not one of {list(ARCHS)}")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise PlanError(f"model {self.name}: duplicate table names")
        if not self.tables:
            raise PlanError(f"model {self.name}: no tables")
        for t in self.tables:
            t.validate()
        _ = self.dense_precision  # a PlanError unless it names a DenseDtype
        self.check_shapes()

    def check_shapes(self) -> None:
        """The architecture's shape rules (what executor.dense.model builds), one line naming the field."""
        where = f"model {self.name}"
        if self.top_mlp and self.top_mlp[-1] != 1:
            raise PlanError(f"{where}: field top_mlp ends in {self.top_mlp[-1]}; it must end in 1 (the click logit)")
        pooled = [t for t in self.tables if t.pooling != "none"]
        dims = sorted({t.dim for t in self.tables})
        # tables of several dims plan (the planner studies them) but dlrm/deepfm run one dim: the executor says so
        if self.arch == "dlrm" and len(dims) == 1 and self.bottom_mlp and self.bottom_mlp[-1] != dims[0]:
            raise PlanError(f"{where}: field bottom_mlp ends in {self.bottom_mlp[-1]}; dlrm needs it to end in "
                            f"the tables' dim {dims[0]}")
        if self.arch == "din":
            for s in (t for t in self.tables if t.pooling == "none"):
                if not any(t.dim == s.dim for t in pooled):
                    raise PlanError(f"{where}: field tables: sequence table {s.name} (dim {s.dim}) has no pooled "
                                    "query table of its dim")
        if self.arch == "wide_deep":
            unknown = [t for t in self.extra.get("wide_tables", []) if t not in self._by_name]
            if unknown:
                raise PlanError(f"{where}: field extra.wide_tables names {unknown[0]!r}, not a table of the model")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tables"] = [asdict(t) for t in self.tables]
        if self.dense_dtype is None:
            del d["dense_dtype"]
        else:
            d["dense_dtype"] = str(self.dense_dtype)  # a plain name in files (YAML too)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "model") -> ModelSpec:
        """A spec from plain data, every field checked (PlanError names the field under `where`)."""
        try:
            spec = _spec_from_dict(d, where)
        except FieldError as exc:
            raise PlanError(f"{exc}") from None
        try:
            spec.validate()
        except PlanError as exc:
            raise PlanError(f"field {where}: {exc}" if where else str(exc)) from None
        return spec


MAX_ROWS = fields.MAX_ROWS  # rows of one table
MAX_DIM = 1 << 16
MAX_WIDTH = 1 << 20  # dense inputs, MLP layer widths
MAX_TABLES = 1 << 16  # tables of one model (the largest published ones hold about a thousand)


def _spec_from_dict(d: object, where: str) -> ModelSpec:
    """Types and ranges of every field of a model spec (the one place they are checked)."""
    fields.mapping(d, where or "(top level)")
    p = f"{where}." if where else ""
    known = {f for f in ModelSpec.__dataclass_fields__}
    unknown = sorted(set(d) - known)
    if unknown:
        raise FieldError(f"field {p}{unknown[0]}: unknown; known: {sorted(known)}")
    for req in ("name", "arch", "num_dense", "tables"):
        if req not in d:
            raise FieldError(f"field {p}{req}: missing")
    tables = fields.sequence(d["tables"], f"{p}tables")
    if not tables:
        raise FieldError(f"field {p}tables: expected at least one table")
    if len(tables) > MAX_TABLES:  # each table costs the planner and the executor work and memory
        raise FieldError(f"field {p}tables: {len(tables):,} tables, more than any real model ({MAX_TABLES:,} at most)")
    return ModelSpec(
        name=fields.text(d["name"], f"{p}name"),
        arch=fields.text(d["arch"], f"{p}arch", ARCHS),
        num_dense=fields.integer(d["num_dense"], f"{p}num_dense", 0, MAX_WIDTH),
        tables=tuple(_table_from_dict(t, f"{p}tables[{i}]") for i, t in enumerate(tables)),
        bottom_mlp=_widths(d.get("bottom_mlp", ()), f"{p}bottom_mlp"),
        top_mlp=_widths(d.get("top_mlp", ()), f"{p}top_mlp"),
        interaction=fields.text(d.get("interaction", "dot"), f"{p}interaction"),
        extra=dict(fields.mapping(d.get("extra", {}), f"{p}extra")),
        dense_dtype=d.get("dense_dtype"),  # checked by validate (dense_precision)
    )


def _widths(v: object, where: str) -> tuple[int, ...]:
    return tuple(fields.integer(x, f"{where}[{i}]", 1, MAX_WIDTH) for i, x in enumerate(fields.sequence(v, where)))


def _table_from_dict(t: object, where: str) -> TableSpec:
    fields.mapping(t, where)
    known = set(TableSpec.__dataclass_fields__)
    unknown = sorted(set(t) - known)
    if unknown:
        raise FieldError(f"field {where}.{unknown[0]}: unknown; known: {sorted(known)}")
    for req in ("name", "num_rows", "dim"):
        if req not in t:
            raise FieldError(f"field {where}.{req}: missing")
    return TableSpec(
        name=fields.text(t["name"], f"{where}.name"),
        num_rows=fields.integer(t["num_rows"], f"{where}.num_rows", 1, MAX_ROWS),
        dim=fields.integer(t["dim"], f"{where}.dim", 1, MAX_DIM),
        dtype=fields.text(t.get("dtype", "fp32"), f"{where}.dtype", tuple(DTYPES)),
        pooling=fields.text(t.get("pooling", "sum"), f"{where}.pooling", POOLINGS),
        optimizer=fields.text(t.get("optimizer", "sgd"), f"{where}.optimizer", OPTIMIZERS),
        initializer=fields.text(t.get("initializer", "uniform"), f"{where}.initializer", INITIALIZERS),
        pooling_factor=fields.real(t.get("pooling_factor", 1.0), f"{where}.pooling_factor", 0.0, 1e6, lo_open=True),
        max_len=fields.integer(t.get("max_len", 1), f"{where}.max_len", 1, MAX_WIDTH),
    )


def attribute_groups(model: ModelSpec) -> list[list[TableSpec]]:
    """Tables grouped by packing attributes (the tables one pack may hold), groups and
    tables in model order."""
    groups: dict[tuple, list[TableSpec]] = {}
    for t in model.tables:
        groups.setdefault(t.attributes(), []).append(t)
    return list(groups.values())


def spec_yaml(model: ModelSpec) -> str:
    """The model spec as YAML that `--model FILE.yaml` reads back (one flow-style line per table)."""
    import yaml

    d = model.to_dict()
    tables = d.pop("tables")
    head = yaml.safe_dump({k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}, sort_keys=False,
                          default_flow_style=None)
    rows = "".join(f"  - {yaml.safe_dump(t, default_flow_style=True, sort_keys=False, width=1 << 16).strip()}\n"
                   for t in tables)
    return f"# picasso model spec ({model.name}); see docs/guide.md 'Model specs'\n{head}tables:\n{rows}"
