"""The trained model as one file: whole tables and dense weights, without the plan that trained it.

`export` reads a checkpoint (any plan, world size and sharding: checkpoint.saved_tables
assembles each table from every rank's cold shard and hot cache, one saved pack at a time)
and writes a safetensors file (executor.run.safetensors_io) whose tensor names are a state
dict of `RecModel`:
- `embedding_bags.<table>.weight`: a table's rows, in the table's own dtype (a 16-bit table
  stays 16-bit), as TorchRec's EmbeddingBagCollection names them;
- `dense.<name>`: the dense model's weights (executor.dense.model).
Its metadata makes it self-describing: the format, the model spec (JSON), per table its rows,
dim, dtype, pooling and the data feature it reads, the dense precision, the steps trained and
the run's last evaluation. `load` builds the plain-PyTorch RecModel from the file alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from executor.run import safetensors_io as st
from executor.run.checkpoint import CheckpointError, read_manifest, saved_dense, saved_model, saved_tables
from executor.run.reference import RecModel
from executor.sparse.lowp import storage_dtype
from foundation.files import check_output_path
from planner.errors import PlanError
from planner.features import candidates
from planner.model_spec import ModelSpec
from planner.plan import Plan

FORMAT = "picasso-model-1"
TABLE_PREFIX = "embedding_bags."
DENSE_PREFIX = "dense."


class ModelFileError(ValueError):
    """A file that is not a picasso model file, or one that does not fit its own model spec."""


@dataclass(frozen=True)
class Exported:
    """What `export` wrote."""

    path: str
    model: str
    tables: int
    parameters: int
    bytes: int
    steps: int
    last_eval: dict | None


def table_key(table: str) -> str:
    return f"{TABLE_PREFIX}{table}.weight"


def _feature_of(model: ModelSpec, table: str) -> dict:
    """The data feature a table reads (planner.features' rule, written out for a reader without it)."""
    first, *rest = candidates(model, table)
    return {"feature": first, **({"else_feature": rest[0]} if rest else {})}


def metadata(model: ModelSpec, manifest: dict) -> dict[str, str]:
    tables = {t.name: {"rows": t.num_rows, "dim": t.dim, "dtype": t.dtype, "pooling": t.pooling,
                       **_feature_of(model, t.name)} for t in model.tables}
    return {
        "format": FORMAT,
        "model": json.dumps(model.to_dict(), sort_keys=True),
        "tables": json.dumps(tables),
        "dense_dtype": str(model.dense_precision),
        "steps": str(int(manifest["steps"])),
        "trained_world_size": str(int(manifest["world_size"])),
        **({"last_eval": json.dumps(manifest["last_eval"])} if manifest.get("last_eval") else {}),
    }


def export(checkpoint: str | os.PathLike, output: str | os.PathLike, plan: Plan | None = None) -> Exported:
    """Write the checkpoint's trained model to `output` (see the module doc); `plan` is needed only
    for a checkpoint whose manifest does not carry its model spec."""
    check_output_path(output)
    m = read_manifest(checkpoint, plan)
    model = saved_model(m, plan)
    dense = saved_dense(m)
    specs = {table_key(t.name): (storage_dtype(t.dtype), (t.num_rows, t.dim)) for t in model.tables}
    for k, v in dense.items():
        specs[DENSE_PREFIX + k] = (v.dtype, tuple(v.shape))
    entries = st.layout(specs)
    _check_dense(model, dense, Path(m["_files_dir"]) / "dense.pt")

    def tensors():
        for t, w, _ in saved_tables(m, model):
            yield table_key(t), w.to(storage_dtype(model.table(t).dtype))
        for k, v in dense.items():
            yield DENSE_PREFIX + k, v

    st.write(output, entries, metadata(model, m), tensors)
    params = sum(st.numel(e.shape) for e in entries.values())
    return Exported(str(output), model.name, len(model.tables), params, Path(output).stat().st_size,
                    int(m["steps"]), m.get("last_eval"))


def _check_dense(model: ModelSpec, dense: dict[str, torch.Tensor], where: Path) -> None:
    """The saved dense weights are exactly the ones the model spec's dense model has."""
    wrong = mismatch(RecModel(_no_tables(model)).dense.state_dict(), dense)
    if wrong:
        raise CheckpointError(f"{where}: dense weight {wrong}")


def mismatch(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> str | None:
    """The first name `got` lacks, shapes otherwise or has beyond `want`, described; None if none."""
    for k, v in want.items():
        if k not in got or tuple(got[k].shape) != tuple(v.shape):
            shape = tuple(got[k].shape) if k in got else None
            return f"{k!r} is missing or shaped {shape}, the model has {tuple(v.shape)}"
    extra = sorted(set(got) - set(want))
    return f"{extra[0]!r} is not one of the model's" if extra else None


def _no_tables(model: ModelSpec) -> ModelSpec:
    """The model with one-row tables: its dense model without allocating the tables."""
    from dataclasses import replace

    return replace(model, tables=tuple(replace(t, num_rows=1) for t in model.tables))


def read_spec(meta: dict[str, str], path: str | os.PathLike) -> ModelSpec:
    """The model spec a model file carries; ModelFileError when it is not a picasso model file."""
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a picasso model file (metadata format {meta.get('format')!r}, "
                             f"expected {FORMAT!r}; `picasso export-model` writes one)")
    try:
        return ModelSpec.from_dict(json.loads(meta["model"]), "model")
    except (KeyError, ValueError, PlanError) as exc:
        raise ModelFileError(f"{path}: metadata model: {exc}") from None


def load(path: str | os.PathLike) -> RecModel:
    """The plain-PyTorch model of a file `export` wrote, in eval mode (fp32 weights)."""
    try:
        tensors, meta = st.read(path)
    except st.SafetensorsError as exc:
        raise ModelFileError(str(exc)) from None
    model = read_spec(meta, path)
    net = RecModel(model)
    wrong = mismatch(net.state_dict(), tensors)
    if wrong:
        raise ModelFileError(f"{path}: tensor {wrong} (by the model spec in its metadata)")
    net.load_state_dict(tensors)  # copied into the model's fp32 weights
    return net.eval()
