"""Writing datasets of many files: DatasetWriter, write_shard + commit
from several processes, commit's checks, gc, and a SIGKILL campaign (the dataset is always the
previous version or the new complete one).

Rows are read back shard by shard through ``manifest.load`` and ``rowstore.open`` of each shard
file (:func:`_read_all`); once ``rowstore.open(root)`` reads datasets, it can replace it."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest
from helpers import scaled

import rowstore
from rowstore import BYTES, Field, Schema
from rowstore.cli import main as cli_main
from rowstore.codecs.blocks import compression_config
from rowstore.format import footer, manifest, spec
from rowstore.writer.commit import ShardInfo, commit
from rowstore.writer.dataset import DatasetWriter, write_shard
from rowstore.writer.gc import gc

SCHEMA = Schema([Field("x", "int64"), Field("t", BYTES)])
INLINE = Schema([Field("x", "int64")])
ITEMSIZE = spec.row_dtype(SCHEMA).itemsize


def cols(lo, hi):
    x = np.arange(lo, hi, dtype=np.int64)
    return {"x": x, "t": [str(i).encode() * 3 for i in x]}


def rows(lo, hi):
    return [{"x": i, "t": str(i).encode() * 3} for i in range(lo, hi)]


def _read_all(root, version=None):
    """Every row of a version (default current) of the dataset, through one reader over all
    shards (and, as a cross-check, shard by shard in manifest order)."""
    m = manifest.load(root, version)
    xs, ts = [np.zeros(0, np.int64)], []
    for p in m.shards["path"]:
        with rowstore.open(os.path.join(root, p)) as r:
            if len(r):
                b = r.take(np.arange(len(r)))
                xs.append(b["x"])
                ts += [bytes(v) for v in b["t"]] if "t" in b else []
    with rowstore.open(root, version=version) as r:
        b = r.take(np.arange(len(r)))
        assert np.array_equal(b["x"], np.concatenate(xs))
        if "t" in b:
            assert [bytes(v) for v in b["t"]] == ts
    return np.concatenate(xs), ts


def xs_of(root, version=None):
    return _read_all(root, version)[0]


def shard_files(root):
    return sorted(os.listdir(os.path.join(root, "shards")))


def named(root, version=None):
    return sorted(os.path.basename(p) for p in manifest.load(root, version).shards["path"])


def make_old(root, rel, age=7200):
    t = time.time() - age
    os.utime(os.path.join(root, rel), (t, t))


# -- DatasetWriter ------------------------------------------------------------------------------
def test_rollover_keeps_rows_in_order_and_blocks_uniform(tmp_path):
    root = str(tmp_path / "ds")
    with DatasetWriter(root, SCHEMA, shard_bytes=3000, block_bytes=400, attrs={"k": 1}) as w:
        for r in rows(0, 150):
            w.write(r)
        w.write_batch(cols(150, 900))
        assert w.num_rows == 900
    m = manifest.load(root)
    assert m.version == 1 and m.num_rows == 900 and m.num_shards >= 5 and m.attrs == {"k": 1}
    assert len(set(m.shards["rows_per_block"].tolist())) == 1
    x, t = _read_all(root)
    assert np.array_equal(x, np.arange(900)) and t == [str(i).encode() * 3 for i in range(900)]
    raw = m.shards["rows"] * ITEMSIZE + m.shards["heap_nbytes"]
    assert (raw[:-1] >= 3000).all() and (
        raw < 3000 + 200
    ).all()  # rolled at the threshold, not far beyond
    assert shard_files(root) == named(root)


def test_a_huge_batch_is_split_between_shards(tmp_path):
    root = str(tmp_path / "ds")
    with DatasetWriter(root, INLINE, shard_bytes=800) as w:  # 100 rows of 8 bytes a shard
        w.write_batch({"x": np.arange(1000)})
    m = manifest.load(root)
    assert m.shards["rows"].tolist() == [100] * 10
    assert np.array_equal(xs_of(root), np.arange(1000))
    root2 = str(tmp_path / "ds2")  # heap payloads: estimated from the first row, then measured
    with DatasetWriter(root2, SCHEMA, shard_bytes=10_000) as w:
        w.write_batch({"x": np.arange(200), "t": [b"p" * 500] * 200})
    m = manifest.load(root2)
    raw = m.shards["rows"] * ITEMSIZE + m.shards["heap_nbytes"]
    assert m.num_shards >= 9 and (raw <= 10_000 + 600).all()
    assert np.array_equal(xs_of(root2), np.arange(200))


def test_nothing_visible_before_close(tmp_path):
    root = str(tmp_path / "ds")
    w = DatasetWriter(root, SCHEMA, shard_bytes=1000)
    w.write_batch(cols(0, 300))
    assert len(w.shards) >= 2 and not manifest.is_dataset(root) and manifest.versions(root) == []
    assert w.close() == 1
    assert np.array_equal(xs_of(root), np.arange(300))
    w = DatasetWriter(root, mode="a", shard_bytes=1000)
    w.write_batch(cols(300, 600))
    assert manifest.read_pointer(root)[0] == 1 and np.array_equal(xs_of(root), np.arange(300))
    assert w.close() == 2
    assert np.array_equal(xs_of(root), np.arange(600))


def test_modes(tmp_path):
    root = str(tmp_path / "ds")
    with DatasetWriter(root, SCHEMA, mode="x", shard_bytes=1000) as w:
        w.write_batch(cols(0, 100))
    with pytest.raises(FileExistsError):
        DatasetWriter(root, SCHEMA, mode="x")
    with DatasetWriter(
        root, mode="a", shard_bytes=1000, attrs={"a": 2}
    ) as w:  # schema from the dataset
        w.write_batch(cols(100, 200))
    assert np.array_equal(xs_of(root), np.arange(200)) and manifest.load(root).attrs == {"a": 2}
    v2_files = named(root)
    with DatasetWriter(root, SCHEMA, mode="w") as w:
        w.write_batch(cols(1000, 1010))
    m = manifest.load(root)
    assert m.version == 3 and m.attrs == {} and np.array_equal(xs_of(root), np.arange(1000, 1010))
    assert np.array_equal(
        xs_of(root, 2), np.arange(200)
    )  # old files stay for the old version's readers
    assert set(v2_files) <= set(shard_files(root))
    with pytest.raises(rowstore.SchemaError):
        DatasetWriter(root, INLINE, mode="a")
    with pytest.raises(ValueError, match="compression"):
        DatasetWriter(root, mode="a", compression="lz4")
    root2 = str(tmp_path / "new")
    with DatasetWriter(root2, SCHEMA, mode="a") as w:  # "a" creates
        w.write_batch(cols(0, 5))
    assert np.array_equal(xs_of(root2), np.arange(5))
    root3 = str(tmp_path / "empty")
    with DatasetWriter(root3, SCHEMA):  # no rows: one empty shard carries the schema
        pass
    assert manifest.load(root3).num_rows == 0 and manifest.load(root3).schema == SCHEMA
    with pytest.raises(rowstore.SchemaError):
        DatasetWriter(str(tmp_path / "none"), mode="a")
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        DatasetWriter(str(f), SCHEMA)


def test_append_keeps_the_datasets_settings(tmp_path):
    root = str(tmp_path / "ds")
    with DatasetWriter(
        root, SCHEMA, rows_per_block=7, shard_bytes=1000, compression="lz4", heap_chunk_bytes=256
    ) as w:
        w.write_batch(cols(0, 100))
    with DatasetWriter(root, mode="a", shard_bytes=1000) as w:
        w.write_batch(cols(100, 200))
    m = manifest.load(root)
    assert set(m.shards["rows_per_block"].tolist()) == {7} and m.heap_chunk_bytes == 256
    assert m.compression == compression_config("lz4")
    assert np.array_equal(xs_of(root), np.arange(200))


def test_bad_attrs_at_close_keep_the_writer_open(tmp_path):
    root = str(tmp_path / "ds")
    w = DatasetWriter(root, SCHEMA, shard_bytes=1000)
    w.write_batch(cols(0, 100))
    w.attrs["bad"] = object()
    with pytest.raises(ValueError, match="JSON"):
        w.close()
    del w.attrs["bad"]
    w.write_batch(cols(100, 110))
    assert w.close() == 1 and np.array_equal(xs_of(root), np.arange(110))


class Boom(Exception):
    pass


def test_abort_and_exception_leave_the_old_version(tmp_path):
    root = str(tmp_path / "ds")
    with pytest.raises(Boom):
        with DatasetWriter(root, SCHEMA, shard_bytes=1000) as w:
            w.write_batch(cols(0, 300))
            raise Boom()
    assert not os.path.exists(root)  # nothing: not even the directories it made
    with DatasetWriter(root, SCHEMA, shard_bytes=1000) as w:
        w.write_batch(cols(0, 300))
    before = shard_files(root)
    for mode in ("w", "a"):
        with pytest.raises(Boom):
            with DatasetWriter(root, SCHEMA, mode=mode, shard_bytes=1000) as w:
                w.write_batch(cols(300, 900))
                raise Boom()
        w2 = DatasetWriter(root, mode="a", shard_bytes=1000)
        w2.write_batch(cols(300, 900))
        w2.abort()
        assert shard_files(root) == before and manifest.versions(root) == [1]
        assert np.array_equal(xs_of(root), np.arange(300))
    with pytest.raises(rowstore.WriterClosedError):
        w2.write(rows(0, 1)[0])


def test_error_rows_are_numbered_in_the_writers_rows(tmp_path):
    root = str(tmp_path / "ds")
    w = DatasetWriter(root, SCHEMA, shard_bytes=1000)
    w.write_batch(cols(0, 250))
    assert len(w.shards) >= 2
    with pytest.raises(rowstore.RowValidationError, match=r"^row 250: field 'x'") as e:
        w.write({"x": "bad", "t": b""})
    assert e.value.row == 250 and e.value.field == "x"
    bad = cols(250, 260)
    bad["x"] = bad["x"].astype(object)
    bad["x"][3] = "bad"
    with pytest.raises(rowstore.RowValidationError, match=r"^row 253") as e:
        w.write_batch(bad)
    assert e.value.row == 253
    big = cols(250, 2000)  # split between shards: validated whole first, nothing written
    big["t"][1500] = 5
    with pytest.raises(rowstore.RowValidationError, match=r"^row 1750") as e:
        w.write_batch(big)
    assert e.value.row == 1750 and w.num_rows == 250
    w.write_batch(cols(250, 300))
    w.close()
    assert np.array_equal(xs_of(root), np.arange(300))


# -- write_shard + commit ------------------------------------------------------------------------
def test_write_shard_from_processes_then_one_commit(tmp_path):
    root, seq = str(tmp_path / "par"), str(tmp_path / "seq")
    parts = [cols(i * 100, i * 100 + 100) for i in range(6)]
    work = functools.partial(write_shard, root, SCHEMA, rows_per_block=16)  # module-level: pickles
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        infos = pool.map(work, parts)
    assert all(isinstance(i, ShardInfo) for i in infos) and len({i.path for i in infos}) == 6
    assert not manifest.is_dataset(root)  # written, not committed
    assert commit(root, infos) == 1
    infos_seq = [write_shard(seq, SCHEMA, p, rows_per_block=16) for p in parts]
    commit(seq, infos_seq)
    (x1, t1), (x2, t2) = _read_all(root), _read_all(seq)
    assert np.array_equal(x1, x2) and t1 == t2
    assert np.array_equal(xs_of(root), np.arange(600))
    a, b = manifest.load(root), manifest.load(seq)
    for k in manifest.SHARD_KEYS[1:]:
        assert np.array_equal(a.shards[k], b.shards[k]), k
    info = infos[0]
    assert pickle.loads(pickle.dumps(info)) == info and hash(info) == hash(
        pickle.loads(pickle.dumps(info))
    )
    assert info.entry()["path"] == a.shards["path"][0] and info.entry()["index_crc32"] == int(
        a.shards["index_crc32"][0]
    )


def test_write_shard_takes_rows_and_a_name(tmp_path):
    root = str(tmp_path / "ds")
    a = write_shard(root, SCHEMA, rows(0, 10), name="first")
    b = write_shard(root, SCHEMA, iter(rows(10, 20)))
    assert (
        a.path == "shards/first.h5"
        and b.path.startswith("shards/part-")
        and len(b.path) == len("shards/part-.h5") + 32
    )
    with pytest.raises(FileExistsError):
        write_shard(root, SCHEMA, rows(0, 1), name="first")
    for bad in ("../x", "a/b", ".hidden", "", "x" * 300):
        with pytest.raises(ValueError, match="plain file name"):
            write_shard(root, SCHEMA, rows(0, 1), name=bad)
    with pytest.raises(rowstore.RowValidationError):
        write_shard(root, SCHEMA, [{"x": 1, "t": 2}], name="bad")
    assert shard_files(root) == sorted(
        [os.path.basename(a.path), os.path.basename(b.path)]
    )  # no partial file
    commit(root, [b, a])
    assert np.array_equal(xs_of(root), np.r_[np.arange(10, 20), np.arange(10)])  # the order given


def test_commit_modes(tmp_path):
    root = str(tmp_path / "ds")
    a, b, c = (write_shard(root, SCHEMA, cols(i * 10, i * 10 + 10)) for i in range(3))
    assert commit(root, [a], mode="x", attrs={"n": 1}) == 1
    with pytest.raises(FileExistsError):
        commit(root, [b], mode="x")
    assert commit(root, [b], mode="a") == 2
    assert manifest.load(root).attrs == {"n": 1}  # "a" keeps the attrs
    assert np.array_equal(xs_of(root), np.arange(20))
    assert commit(root, [c, a], mode="w") == 3
    assert np.array_equal(xs_of(root), np.r_[np.arange(20, 30), np.arange(10)])
    assert manifest.load(root).attrs == {} and np.array_equal(xs_of(root, 2), np.arange(20))
    with pytest.raises(ValueError, match="nothing to commit"):
        commit(str(tmp_path / "other"), [], mode="a")
    assert not os.path.exists(tmp_path / "other")
    with pytest.raises(ValueError, match="JSON"):
        commit(root, [b], mode="a", attrs={"x": object()})
    assert manifest.versions(root) == [1, 2, 3]


def _expect_refused(root, infos, exc, match, **kw):
    before = manifest.versions(root)
    with pytest.raises(exc, match=match):
        commit(root, infos, **kw)
    assert manifest.versions(root) == before


def test_commit_checks_every_shard(tmp_path):
    root = str(tmp_path / "ds")
    ok = write_shard(root, SCHEMA, cols(0, 50), rows_per_block=8)
    commit(root, [ok])
    missing = write_shard(root, SCHEMA, cols(50, 60))
    os.unlink(os.path.join(root, missing.path))
    _expect_refused(root, [missing], rowstore.FormatError, "missing", mode="a")
    resized = write_shard(root, SCHEMA, cols(50, 60))
    with open(os.path.join(root, resized.path), "ab") as f:
        f.write(b"\0" * 10)
    _expect_refused(root, [resized], rowstore.FormatError, "bytes, expected", mode="a")
    tampered = write_shard(root, SCHEMA, cols(50, 60), rows_per_block=4)
    _expect_refused(root, [dataclasses.replace(tampered, index_crc32=tampered.index_crc32 ^ 1)],
                    rowstore.FormatError, "index CRC-32", mode="a")  # fmt: skip
    _expect_refused(
        root,
        [dataclasses.replace(tampered, rows=11)],
        rowstore.FormatError,
        "rows of the file",
        mode="a",
    )
    # The file's own block index (in its v2 footer, CRCs recomputed) changed in place (same size):
    # its CRC no longer matches the one recorded for the shard.
    p = os.path.join(root, tampered.path)
    L = rowstore.Layout.open(p)
    data = bytearray(open(p, "rb").read())
    at = L.footer_offset + bytes(data[L.footer_offset :]).index(L.blocks.tobytes())
    b = L.blocks.copy()
    b["checksum"][0] ^= 1
    data[at : at + b.nbytes] = b.tobytes()
    head = struct.pack("<8sQQI", footer.TRAILER_MAGIC, L.footer_offset, len(data) - 32 - L.footer_offset,
                       zlib.crc32(bytes(data[L.footer_offset : -32])))  # fmt: skip
    data[-32:] = head + struct.pack("<I", zlib.crc32(head))
    open(p, "wb").write(bytes(data))
    assert os.path.getsize(os.path.join(root, tampered.path)) == tampered.file_size
    _expect_refused(root, [tampered], rowstore.FormatError, "index CRC-32", mode="a")
    other = write_shard(root, INLINE, {"x": np.arange(3)})
    _expect_refused(root, [other], rowstore.SchemaError, "schema differs", mode="a")
    good = write_shard(root, SCHEMA, cols(50, 60))
    _expect_refused(root, [good, other], rowstore.SchemaError, "schema differs", mode="w")
    lz4 = write_shard(root, SCHEMA, cols(50, 60), compression="lz4")
    _expect_refused(root, [lz4], ValueError, "compression", mode="a")
    h = write_shard(root, SCHEMA, cols(50, 60), heap_chunk_bytes=128)
    _expect_refused(root, [h], ValueError, "heap_chunk_bytes", mode="a")
    _expect_refused(root, [good, good], ValueError, "given twice", mode="a")
    _expect_refused(root, [ok], ValueError, "already in version 1", mode="a")
    _expect_refused(root, [good, ok], ValueError, "already in version 1", mode="a")
    _expect_refused(
        root,
        [dataclasses.replace(good, path="../x.h5")],
        rowstore.FormatError,
        "relative path",
        mode="a",
    )
    with pytest.raises(TypeError):
        commit(root, [good.entry()], mode="a")
    assert commit(root, [good], mode="a") == 2
    assert np.array_equal(xs_of(root), np.arange(60))


# -- readers of older versions, gc ----------------------------------------------------------------
def test_a_reader_of_version_k_is_unaffected_by_an_append(tmp_path):
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, cols(0, 40), rows_per_block=8)])
    m1 = manifest.load(root)
    readers = [rowstore.open(os.path.join(root, p)) for p in m1.shards["path"]]
    first = [r.take(np.arange(len(r)))["x"] for r in readers]
    with DatasetWriter(root, mode="a", shard_bytes=500) as w:
        w.write_batch(cols(40, 200))
    assert manifest.read_pointer(root)[0] == 2
    again = [r.take(np.arange(len(r)))["x"] for r in readers]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert np.array_equal(xs_of(root, 1), np.arange(40)) and np.array_equal(
        xs_of(root), np.arange(200)
    )
    assert manifest.load(root, 1).shards["path"] == m1.shards["path"]
    for r in readers:
        r.close()


def test_gc_removes_only_what_no_kept_version_names(tmp_path, capsys):
    root = str(tmp_path / "ds")
    a = write_shard(root, SCHEMA, cols(0, 10))
    b = write_shard(root, SCHEMA, cols(10, 20))
    c = write_shard(root, SCHEMA, cols(20, 30))
    commit(root, [a])  # v1: a
    commit(root, [b], mode="w")  # v2: b
    commit(root, [c], mode="a")  # v3: b c
    old = write_shard(root, SCHEMA, cols(0, 1))  # committed by nobody, long ago
    make_old(root, old.path)
    young = write_shard(root, SCHEMA, cols(0, 1))  # committed by nobody yet: a job still writing
    stale_tmp = os.path.join(root, "shards", ".x.h5.0123456789ab.rowstore-tmp")
    open(stale_tmp, "wb").close()
    everything = (
        sorted(os.listdir(os.path.join(root, "shards"))),
        sorted(os.listdir(os.path.join(root, "_manifests"))),
    )

    report = gc(root)  # dry run by default
    assert report.dry_run and report.current == 3 and report.kept_versions == [3]
    assert sorted(report.shards) == sorted([a.path, old.path]) and report.young == [young.path]
    assert set(report.manifests) == {"_manifests/v00000001.json", "_manifests/v00000001.index",
                                     "_manifests/v00000002.json", "_manifests/v00000002.index"}  # fmt: skip
    assert report.temporaries == ["shards/.x.h5.0123456789ab.rowstore-tmp"]
    assert (
        sorted(os.listdir(os.path.join(root, "shards"))),
        sorted(os.listdir(os.path.join(root, "_manifests"))),
    ) == everything
    assert (
        cli_main(["gc", root]) == 0 and "dry run" in capsys.readouterr().out
    )  # the CLI: lists only
    assert sorted(os.listdir(os.path.join(root, "shards"))) == everything[0]

    report = gc(root, dry_run=False, keep_versions=2)
    assert report.kept_versions == [2, 3] and sorted(report.shards) == sorted([a.path, old.path])
    assert manifest.versions(root) == [2, 3] and not os.path.exists(stale_tmp)
    assert sorted(shard_files(root)) == sorted(os.path.basename(i.path) for i in (b, c, young))
    assert np.array_equal(xs_of(root, 2), np.arange(10, 20)) and np.array_equal(
        xs_of(root), np.arange(10, 30)
    )

    assert (
        cli_main(["gc", root, "--delete", "--grace", "0"]) == 0
    )  # keeps 1 version; young is now old enough
    out = capsys.readouterr().out
    assert "removed: _manifests/v00000002.json" in out and f"removed: {young.path}" in out
    assert manifest.versions(root) == [3] and shard_files(root) == named(root)
    assert np.array_equal(xs_of(root), np.arange(10, 30))
    open(tmp_path / "file.h5", "wb").close()
    assert (
        cli_main(["gc", str(tmp_path / "file.h5")]) == 0
    )  # not a dataset: the file behaviour, unchanged
    assert "stale temporary file(s), kept 0 in use" in capsys.readouterr().out


def test_commit_removes_old_orphans_and_temporaries(tmp_path):
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, cols(0, 10))])
    old, young = write_shard(root, SCHEMA, cols(0, 1)), write_shard(root, SCHEMA, cols(0, 1))
    make_old(root, old.path)
    for d in ("", "shards", "_manifests"):
        open(os.path.join(root, d, ".f.0123456789ab.rowstore-tmp"), "wb").close()
    commit(root, [write_shard(root, SCHEMA, cols(10, 20))], mode="a")
    files = shard_files(root)
    assert os.path.basename(old.path) not in files and os.path.basename(young.path) in files
    assert not any(
        n.endswith(".rowstore-tmp")
        for d in ("", "shards", "_manifests")
        for n in os.listdir(os.path.join(root, d))
    )
    commit(root, [], mode="a", orphan_grace_s=0)  # a new version with the same shards, new clean-up
    assert shard_files(root) == named(root) and np.array_equal(xs_of(root), np.arange(20))


def test_gc_refuses_what_is_not_a_dataset(tmp_path):
    with pytest.raises(rowstore.FormatError):
        gc(str(tmp_path))
    with pytest.raises(ValueError):
        gc(str(tmp_path), keep_versions=0)


# -- SIGKILL campaign ------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import rowstore
    from rowstore import BYTES, Field, Schema

    root, how, base, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    schema = Schema([Field("x", "int64"), Field("t", BYTES)])

    def cols(lo, hi):
        x = np.arange(lo, hi, dtype=np.int64)
        return {"x": x, "t": [str(i).encode() * 3 for i in x]}

    print("ready", flush=True)
    if how == "writer":
        with rowstore.DatasetWriter(root, schema, mode="a", shard_bytes=1500, rows_per_block=8) as w:
            for lo in range(base, base + n, 20):
                w.write_batch(cols(lo, min(lo + 20, base + n)))
                print("wrote", flush=True)
    else:
        step = n // 4
        infos = []
        for lo in range(base, base + n, step):
            infos.append(rowstore.write_shard(root, schema, cols(lo, lo + step), rows_per_block=8))
            print("wrote", flush=True)
        rowstore.commit(root, infos, mode="a", orphan_grace_s=0)
    print("done", flush=True)
""")


def test_sigkill_leaves_the_previous_version_or_the_new_one(tmp_path):
    root = str(tmp_path / "ds")
    rng = random.Random(20240610)
    expected = np.zeros(0, np.int64)
    outcomes = []
    for round_ in range(10):
        how = ("writer", "two-phase")[round_ % 2]
        base, n = round_ * 1000, 400
        proc = subprocess.Popen([sys.executable, "-c", CHILD, root, how, str(base), str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        if round_ in (2, 3):  # killed once it wrote its first batch or shard: surely mid-write
            assert proc.stdout.readline() == "wrote\n", proc.stderr.read()
        else:  # anywhere: each child writes for ~0.2-0.3 s after "ready" on an idle machine
            time.sleep(rng.uniform(0.0, 0.35))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=scaled(60))
        if proc.returncode != -signal.SIGKILL:
            assert proc.returncode == 0 and "done" in out, err
        new = np.r_[expected, np.arange(base, base + n)]
        if not manifest.is_dataset(root):
            assert expected.size == 0
            outcomes.append("none")
            continue
        got = xs_of(root)  # manifest.load never fails on what is current
        if np.array_equal(got, new):
            expected = new
            outcomes.append("new")
        else:
            assert np.array_equal(got, expected), f"round {round_}: a mix of versions"
            outcomes.append("old")
    assert set(outcomes[2:4]) <= {"old", "none"}, outcomes  # the kills after a first batch or shard
    # The next commit and gc remove every leftover: files no version names, temporaries, manifests
    # of killed commits above the current version.
    commit(root, [write_shard(root, SCHEMA, cols(-5, 0))], mode="a", orphan_grace_s=0)
    expected = np.r_[expected, np.arange(-5, 0)]
    gc(root, dry_run=False, keep_versions=1, orphan_grace_s=0)
    assert np.array_equal(xs_of(root), expected)
    assert shard_files(root) == named(root)
    v = manifest.read_pointer(root)[0]
    assert sorted(os.listdir(os.path.join(root, "_manifests"))) == sorted(
        [
            ".lock",
            os.path.basename(manifest.manifest_path(v)),
            os.path.basename(manifest.index_path(v)),
        ]
    )
    assert sorted(os.listdir(root)) == ["_manifests", "rowstore.json", "shards"]


def test_a_killed_commits_leftovers_block_nothing(tmp_path):
    """A commit killed after its sidecar (or its manifest) but before the pointer: the next commit
    takes the next free version; gc keeps the leftover manifest while it is the newest one that
    loads, and removes it once a later commit supersedes it."""
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, cols(0, 10))])
    left = write_shard(root, SCHEMA, cols(10, 20))
    with open(
        os.path.join(root, manifest.index_path(2)), "wb"
    ) as f:  # sidecar written, then killed
        f.write(manifest.INDEX_MAGIC)
    assert commit(root, [write_shard(root, SCHEMA, cols(20, 30))], mode="a") == 3
    assert not os.path.exists(os.path.join(root, manifest.index_path(2)))  # removed by the clean-up
    with manifest.commit_lock(root):  # a manifest published but never made current
        manifest.publish(root, schema=SCHEMA, attrs={}, compression={"id": "none"}, heap_chunk_bytes=left.heap_chunk_bytes,
                         shards=[left.entry()], blocks=[Layout_of(root, left).blocks],
                         heap_chunks=[Layout_of(root, left).heap_chunks], parent=3)  # fmt: skip
    with open(os.path.join(root, manifest.POINTER), "w") as f:  # ...as if the pointer never moved
        f.write(pointer_of(root, 3))
    assert manifest.read_pointer(root)[0] == 3 and manifest.versions(root) == [1, 3, 4]
    r = gc(root, dry_run=False, orphan_grace_s=0)
    # The newest manifest that loads is kept, with its shard, though never current.
    assert r.kept_versions == [3] and r.spared == 4 and r.shards == [] and r.young == []
    assert "_manifests/v00000004.json" not in r.manifests
    assert os.path.exists(os.path.join(root, left.path)) and manifest.versions(root) == [3, 4]
    assert np.array_equal(xs_of(root), np.r_[np.arange(10), np.arange(20, 30)])
    assert commit(root, [left], mode="a") == 5  # the killed commit, retried (4 is never reused)
    assert np.array_equal(xs_of(root), np.r_[np.arange(10), np.arange(20, 30), np.arange(10, 20)])
    r = gc(root, dry_run=False)  # 4 is no longer the newest: it goes as never current
    assert r.spared is None and "_manifests/v00000004.json" in r.manifests
    assert manifest.versions(root) == [5]


def Layout_of(root, info):
    return rowstore.Layout.open(os.path.join(root, info.path))


def pointer_of(root, version):
    import json
    import zlib

    with open(os.path.join(root, manifest.manifest_path(version)), "rb") as f:
        crc = zlib.crc32(f.read())
    return json.dumps({"format": manifest.FORMAT_NAME, "format_version": 1, "version": version,
                       "manifest": manifest.manifest_path(version), "manifest_crc32": crc})  # fmt: skip
