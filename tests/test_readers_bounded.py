"""traces.readers: readers linear in their input, and every limit (line, field, columns) refused or
counted in one line naming the file and the limit, never an anonymous error."""

from __future__ import annotations

import gzip
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces import ids
from traces.errors import TraceError
from traces.readers import MAX_COLUMNS, _BlockSource, open_reader, sample_lines


def _read_all(source: _BlockSource) -> bytes:
    return b"".join(block for block, _ in source)


@pytest.mark.parametrize("compressed", [False, True])
def test_a_long_line_is_gathered_in_linear_time(tmp_path, compressed):
    # 16 MiB in 4 KiB blocks: searching and copying the whole gathered line per block (the
    # quadratic way) scans about 32 GB, which takes tens of seconds; gathered linearly, well under one.
    line = b"a" * (16 << 20) + b"\n"
    body = line + b"1\t2\n"
    path = tmp_path / ("long.gz" if compressed else "long.txt")
    path.write_bytes(gzip.compress(body, compresslevel=1) if compressed else body)
    t0 = time.perf_counter()
    got = _read_all(_BlockSource(str(path), 4096))
    assert time.perf_counter() - t0 < 4.0  # a hang guard with a wide margin, not a speed goal
    assert got == body


def test_sample_of_a_long_first_line_keeps_the_lines_after(tmp_path):
    path = tmp_path / "long.csv"
    path.write_bytes(b"label,c1\n0," + b"x" * (2 << 20) + b"\n1,y\n")
    assert [len(x) for x in sample_lines(str(path))] == [8, 2 + (2 << 20), 3]


def test_a_field_over_csv_limit_in_the_first_lines_is_one_malformed_row(tmp_path):
    # csv's default field limit is 128 KiB: the layout check must not fail on such a field, and the
    # row holding it is malformed (naming the limit) while the good rows are read
    path = tmp_path / "wide_field.csv"
    big = b"v" * (200 << 10)
    path.write_bytes(b"label,c1,c2\n" + b"0," + big + b",a\n" + b"1,b,c\n" * 50)
    reader = open_reader(path, "csv")
    rows = sum(chunk.rows for chunk in reader)
    assert rows == 50
    assert reader.stats.rows_bad == 1
    reason = reader.stats.first_bad_reasons[0]
    assert f"{path}:2: field c1" in reason and f"{ids.MAX_VALUE_BYTES:,}" in reason
    with pytest.raises(TraceError, match=f"{ids.MAX_VALUE_BYTES:,}"):
        list(open_reader(path, "csv", strict=True))


def test_a_bag_over_the_value_limit_is_malformed_too(tmp_path):
    path = tmp_path / "bags.csv"
    path.write_bytes(b"label,tags\n0," + b"|".join([b"t%06d" % i for i in range(20000)]) + b"\n1,a|b\n")
    reader = open_reader(path, "csv", multi_sep="|")
    assert sum(chunk.rows for chunk in reader) == 1
    assert reader.stats.rows_bad == 1


def test_long_values_hash_as_short_ones_do():
    """A value past the vectorised length is hashed on its own, by the same FNV-1a."""

    def fnv(raw: bytes) -> int:
        h = 0xCBF29CE484222325
        for b in raw:
            h = ((h ^ b) * 0x100000001B3) % (1 << 64)
        return h & 0x7FFF_FFFF_FFFF_FFFF

    values = [b"abc", b"x" * (ids.VECTOR_HASH_BYTES + 1), b"", b"hello", b"y" * 5000]
    got = ids.fnv1a64(pa.array(values, pa.binary()))
    assert got.tolist() == [fnv(v) for v in values]


def test_a_log_wider_than_the_column_limit_is_refused(tmp_path):
    width = MAX_COLUMNS + 1
    head = ",".join(f"c{i}" for i in range(width))
    path = tmp_path / "wide.csv"
    path.write_text(head + "\n" + ",".join("1" for _ in range(width)) + "\n")
    with pytest.raises(TraceError, match=rf"{path}: {width:,} columns, more than the {MAX_COLUMNS:,}"):
        open_reader(path, "csv")
    with pytest.raises(TraceError, match=f"{width:,} columns"):
        open_reader(path, "csv", header=False)
    pq.write_table(pa.table({f"c{i}": np.zeros(1, np.int64) for i in range(width)}), tmp_path / "wide.parquet")
    with pytest.raises(TraceError, match=f"{width:,} columns"):
        open_reader(tmp_path / "wide.parquet", "parquet")


def test_a_libfm_file_of_too_many_fields_is_refused(tmp_path):
    path = tmp_path / "wide.libfm"
    path.write_text("1 " + " ".join(f"{i}:{i}:1" for i in range(MAX_COLUMNS + 5)) + "\n0 1:1:1\n")
    with pytest.raises(TraceError, match=f"{MAX_COLUMNS + 5:,} libfm fields, more than the {MAX_COLUMNS:,}"):
        open_reader(path, "libsvm")
    late = tmp_path / "late.libfm"  # fields first met past the sample
    late.write_text("1 1:1:1\n" * 3000 + "0 " + " ".join(f"{i}:{i}:1" for i in range(MAX_COLUMNS + 5)) + "\n")
    with pytest.raises(TraceError, match="libfm fields, more than"):
        list(open_reader(late, "libsvm"))
