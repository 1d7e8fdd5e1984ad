"""A resume takes every row of every table from exactly one saved piece: pieces that leave rows out
or give them twice are refused, naming the table and the rows (never a table resumed as zeros)."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.sparse.embedding import assemble_pieces
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model


def _piece(rows: list[int], cols: tuple[int, int], weight: torch.Tensor) -> dict:
    r = torch.tensor(rows, dtype=torch.long)
    return {"rows": r, "cols": list(cols), "weight": weight[r, cols[0]:cols[1]].clone(), "state": None,
            "hot_rows": torch.zeros(0, dtype=torch.long), "hot_weight": torch.zeros(0, weight.shape[1]),
            "hot_state": None}


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), split=st.integers(1, 4), column=st.booleans(), data=st.data())
def test_pieces_assemble_only_when_every_cell_comes_from_one_piece(rows, split, column, data):
    dim = 4
    weight = torch.arange(rows * dim, dtype=torch.float32).reshape(rows, dim) + 1
    owner = data.draw(st.lists(st.integers(0, split - 1), min_size=rows, max_size=rows))
    # row-wise: rows dealt to `split` pieces; column-wise: every row in two pieces of half the columns
    parts = ([(list(range(rows)), (0, 2)), (list(range(rows)), (2, 4))] if column
             else [([r for r in range(rows) if owner[r] == k], (0, dim)) for k in range(split)])
    dropped = data.draw(st.lists(st.integers(0, rows - 1), max_size=2, unique=True))
    doubled = data.draw(st.lists(st.integers(0, rows - 1), max_size=2, unique=True))
    pieces = [_piece([r for r in rs if r not in dropped], cols, weight) for rs, cols in parts]
    if doubled:
        pieces.append(_piece(doubled, parts[0][1], weight))
    cells = np.zeros((rows, dim), int)  # how many pieces give each cell
    for p in pieces:
        for r in p["rows"].tolist():
            cells[r, p["cols"][0]:p["cols"][1]] += 1
    exact = bool((cells == 1).all())
    if exact:
        w, _ = assemble_pieces(pieces, rows, dim)
        assert torch.equal(w, weight)
    else:
        with pytest.raises(ValueError, match="piece"):
            assemble_pieces(pieces, rows, dim)


def _rewrite_sizes(version, manifest_paths) -> None:
    for mp in manifest_paths:
        m = json.loads(mp.read_text())
        for f in m["files"]:
            data = (version / f).read_bytes()
            m["files"][f] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        mp.write_text(json.dumps(m))


@pytest.mark.dist
def test_a_pack_file_copied_over_another_ranks_is_refused_on_resume(tmp_path, capsys):
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "data.tsv", 400, seed=0)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(300), bottom_mlp=(16, 16), top_mlp=(8, 1))
    plan = Plan(m, 2, 16, [PackPlan("pack0", m.table_names[:13], "row_wise"),
                            PackPlan("pack1", m.table_names[13:], "column_wise")])
    plan.save(tmp_path / "plan.json")
    base = ["run", str(tmp_path / "plan.json"), "--data", str(tmp_path / "data.tsv"), "--steps", "2"]
    assert main([*base, "--checkpoint", str(tmp_path / "ck")]) == 0
    capsys.readouterr()
    ck = tmp_path / "ck"
    version = ck / json.loads((ck / "manifest.json").read_text())["dir"]
    shutil.copyfile(version / "rank0.pack0.pt", version / "rank1.pack0.pt")  # rank 1's rows gone
    _rewrite_sizes(version, [version / "manifest.json", ck / "manifest.json"])
    rc = main([*base, "--resume", str(ck)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "table 'C1' rows" in err[0] and "in no saved piece" in err[0], err
