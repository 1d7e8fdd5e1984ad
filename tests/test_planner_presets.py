import pytest

from planner.errors import PlanError
from planner.presets import META_MEAN_POOLING, PRESETS, get_model


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_deterministic(name):
    a, b = get_model(name), get_model(name)
    a.validate()
    assert a == b
    assert a.to_dict() == b.to_dict()


def test_criteo_kaggle_shape():
    m = get_model("dlrm-criteo-kaggle")
    assert len(m.tables) == 26 and m.table("C3").num_rows == 10131227
    assert m.bottom_mlp[-1] == m.tables[0].dim == 16 and m.top_mlp == (512, 256, 1)


def test_meta_856_matches_published_totals():
    m = get_model("meta-856")
    assert len(m.tables) == 856
    mean_pool = sum(t.pooling_factor for t in m.tables) / 856
    assert mean_pool == pytest.approx(META_MEAN_POOLING, rel=0.05)
    assert len({t.attributes() for t in m.tables}) == 2  # two packing groups


def test_din_has_sequence_features_and_wide_deep_two_groups():
    din = get_model("din")
    seq = [t for t in din.tables if t.pooling == "none"]
    assert seq and all(t.pooling_factor >= 100 for t in seq)
    wd = get_model("wide-deep")
    assert len({t.attributes() for t in wd.tables}) == 2


def test_yaml_spec_with_defaults(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(
        "name: tiny\narch: dlrm\nnum_dense: 4\nbottom_mlp: [8, 4]\ntop_mlp: [8, 1]\n"
        "table_defaults: {dim: 4}\ntables:\n  - {name: a, num_rows: 100}\n  - {name: b, num_rows: 50, pooling_factor: 3}\n"
    )
    m = get_model(str(f))
    assert m.table("a").dim == 4 and m.table("b").pooling_factor == 3
    assert m.with_row_cap(60).table("a").num_rows == 60


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: x\narch: dlrm\nnum_dense: 1\ntables: []\n", "non-empty list"),
        ("name: x\narch: dlrm\nnum_dense: 1\ntables:\n  - {name: a, dim: 4}\n", "missing field 'num_rows'"),
        ("name: x\narch: dlrm\nnum_dense: 1\ntables:\n  - {name: a, num_rows: 3, dim: 4, colour: red}\n", "colour"),
        ("name: x\narch: lstm\nnum_dense: 1\ntables:\n  - {name: a, num_rows: 3, dim: 4}\n", "field arch: 'lstm'"),
        ("[unclosed\n", "cannot parse"),
    ],
)
def test_bad_yaml_specs_give_one_clear_line(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(PlanError, match=message) as info:
        get_model(str(f))
    assert str(f) in str(info.value) and "\n" not in str(info.value)


def test_unknown_preset():
    with pytest.raises(PlanError, match="unknown model preset"):
        get_model("no-such-model")
