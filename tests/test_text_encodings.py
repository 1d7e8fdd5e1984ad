"""Text data as Windows tools write it (a UTF-8 BOM, UTF-16 or UTF-32 with a BOM, CRLF line ends, plain or
gzip) reads as the same rows as plain UTF-8; such a file cannot be cut into byte ranges, so every
rank reads it whole (foundation.text, traces.readers)."""

from __future__ import annotations

import codecs
import gzip
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.errors import TraceError
from traces.readers import open_reader, whole_read_reason

ENCODINGS = {
    "utf-8-sig": lambda t: t.encode("utf-8-sig"),
    "utf-16-le": lambda t: codecs.BOM_UTF16_LE + t.encode("utf-16-le"),
    "utf-16-be": lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"),
    "utf-32-le": lambda t: codecs.BOM_UTF32_LE + t.encode("utf-32-le"),
    "utf-32-be": lambda t: codecs.BOM_UTF32_BE + t.encode("utf-32-be"),
}


def _criteo(rng: random.Random, n: int) -> str:
    rows = []
    for _ in range(n):
        dense = [str(rng.randint(0, 99)) if rng.random() > 0.2 else "" for _ in range(13)]
        cats = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.1 else "" for _ in range(26)]
        rows.append("\t".join([str(rng.randint(0, 1)), *dense, *cats]))
    return "\n".join(rows) + "\n"


def _csv(rng: random.Random, n: int) -> str:
    rows = ["click,user,item,price"]
    rows += [f"{rng.randint(0, 1)},u{rng.randint(0, 40)},ï{rng.randint(0, 60)},{rng.random():.3f}" for _ in range(n)]
    return "\n".join(rows) + "\n"


def _libsvm(rng: random.Random, n: int) -> str:
    return "".join(f"{rng.choice(['-1', '1'])} " + " ".join(f"{rng.randint(0, 50)}:1" for _ in range(3)) + "\n"
                   for _ in range(n))


FORMATS = {"criteo": (_criteo, {}), "csv": (_csv, {"dense": "price"}), "libsvm": (_libsvm, {})}


def _rows(path, fmt: str, **opts) -> tuple:
    reader = open_reader(str(path), fmt, **opts)
    chunks = list(reader)
    labels = np.concatenate([c.labels for c in chunks])
    dense = np.concatenate([c.dense for c in chunks])
    ids = {f: np.concatenate([c.sparse[f][0] for c in chunks]) for f in chunks[0].sparse}
    return labels.tolist(), dense.tolist(), {f: v.tolist() for f, v in ids.items()}, reader.stats.rows_bad


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(FORMATS)), enc=st.sampled_from(sorted(ENCODINGS)), crlf=st.booleans(),
       gz=st.booleans(), seed=st.integers(0, 1 << 20))
def test_data_with_a_bom_reads_as_the_same_rows(tmp_path_factory, fmt, enc, crlf, gz, seed):
    make, opts = FORMATS[fmt]
    text = make(random.Random(seed), 60)
    d = tmp_path_factory.mktemp("enc")
    (d / "plain").write_bytes(text.encode())
    raw = ENCODINGS[enc](text.replace("\n", "\r\n") if crlf else text)
    (d / "other").write_bytes(gzip.compress(raw) if gz else raw)
    assert _rows(d / "other", fmt, **opts) == _rows(d / "plain", fmt, **opts)
    assert whole_read_reason(str(d / "other")) == ("gzip-compressed" if gz else
                                                   None if enc == "utf-8-sig" else f"{enc.upper()} text")


def test_bytes_that_are_not_utf16_make_their_row_malformed(tmp_path):
    rows = _criteo(random.Random(1), 20).splitlines(keepends=True)
    label, _, *rest = rows[5].split("\t")
    raw = codecs.BOM_UTF16_LE + "".join(rows[:5]).encode("utf-16-le")
    raw += f"{label}\t".encode("utf-16-le") + b"\x00\xd8" + "7".encode("utf-16-le")  # a lone surrogate in I1
    raw += ("\t" + "\t".join(rest) + "".join(rows[6:])).encode("utf-16-le")
    (tmp_path / "d.tsv").write_bytes(raw)
    labels, _, _, bad = _rows(tmp_path / "d.tsv", "criteo")
    assert bad == 1 and len(labels) == 19
    with pytest.raises(TraceError, match=r"d.tsv:6: field I1"):
        _rows(tmp_path / "d.tsv", "criteo", strict=True)


def test_a_utf16_log_is_read_whole_not_by_byte_ranges(tmp_path):
    from executor.data.text_ranges import splittable, whole_read_note

    (tmp_path / "d.tsv").write_bytes(ENCODINGS["utf-16-le"](_criteo(random.Random(2), 10)))
    assert not splittable(str(tmp_path / "d.tsv"), "criteo")
    assert "UTF-16-LE text" in whole_read_note(str(tmp_path / "d.tsv"))
    with pytest.raises(TraceError, match="cannot be read by byte ranges"):
        open_reader(str(tmp_path / "d.tsv"), "criteo", byte_range=(0, 100))


def test_a_field_map_written_with_a_bom_reads(tmp_path):
    (tmp_path / "d.svm").write_text(_libsvm(random.Random(3), 30))
    (tmp_path / "map.txt").write_bytes(ENCODINGS["utf-16-le"]("low 0 24\nhigh 25 50\n"))
    assert set(_rows(tmp_path / "d.svm", "libsvm", field_map=str(tmp_path / "map.txt"))[2]) == {"low", "high"}


def test_analyze_reads_a_log_that_powershell_wrote(tmp_path, capsys):
    from picasso.cli import main

    text = _criteo(random.Random(4), 200)
    (tmp_path / "plain.tsv").write_text(text)
    (tmp_path / "win.tsv").write_bytes(ENCODINGS["utf-16-le"](text.replace("\n", "\r\n")))
    outs = []
    for name in ("plain", "win"):
        assert main(["analyze", str(tmp_path / f"{name}.tsv"), "--format", "criteo", "--json"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
