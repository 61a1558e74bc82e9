"""One reader over all shards of a dataset: row numbering, every epoch order, sharding, resume,
pickling, bounded descriptors, versions, and the errors of damaged datasets.

Datasets are built here from shard files and ``manifest.publish`` (what ``commit`` calls), so
the read side is tested on its own; shards deliberately differ in rows per block.
"""

from __future__ import annotations

import json
import os
import pickle
import zlib

import numpy as np
import pytest

import rowstore
from rowstore.errors import FormatError, FormatVersionError, SchemaError
from rowstore.format import manifest as M
from rowstore.format.index import Layout

#: Shard sizes and rows per block: partial blocks in the middle of the dataset, a shard smaller
#: than one block, and shards of different block sizes.
SHARDS = [(23, 7), (5, 7), (16, 4), (1, 3), (30, 7)]


def build(root, schema, rows, *, shards=SHARDS, compression=None, attrs=None):
    """A dataset at ``root`` of ``rows`` cut into ``shards`` ((rows, rows_per_block) each)."""
    os.makedirs(os.path.join(root, M.SHARD_DIR), exist_ok=True)
    entries, blocks, chunks, pos = [], [], [], 0
    existing = len(os.listdir(os.path.join(root, M.SHARD_DIR)))
    for k, (n, rpb) in enumerate(shards):
        rel = f"{M.SHARD_DIR}/s{existing + k:03d}.h5"
        with rowstore.Writer(
            os.path.join(root, rel), schema, rows_per_block=rpb, compression=compression
        ) as w:
            for r in rows[pos : pos + n]:
                w.write(r)
        pos += n
        L = Layout.open(os.path.join(root, rel))
        entries.append(M.shard_entry(rel, L))
        blocks.append(L.blocks)
        chunks.append(L.heap_chunks)
    return entries, blocks, chunks, L


def publish(root, schema, entries, blocks, chunks, L, attrs=None):
    with M.commit_lock(root):
        return M.publish(
            root,
            schema=schema,
            attrs=attrs or {},
            compression=L.compression,
            heap_chunk_bytes=L.heap_chunk_bytes,
            shards=entries,
            blocks=blocks,
            heap_chunks=chunks,
        )


@pytest.fixture(params=[None, "lz4"], ids=["raw", "lz4"])
def dataset(request, tmp_path, rs):
    schema = rs.all_kinds_schema(nullable=True)
    n = sum(s[0] for s in SHARDS)
    rows = rs.make_rows(schema, n, seed=3)
    root = str(tmp_path / "ds")
    e, b, c, L = build(root, schema, rows, compression=request.param)
    publish(root, schema, e, b, c, L, attrs={"who": "test"})
    return root, schema, rows


def test_rows_are_numbered_across_shards(dataset, rs):
    root, schema, rows = dataset
    with rowstore.open(root) as r:
        assert len(r) == len(rows) and r.layout.num_shards == len(SHARDS)
        assert r.layout.user_attrs == {"who": "test"} and r.layout.version == 1
        rs.assert_batch_equal(schema, rows, r.take(np.arange(len(rows))))
        perm = np.random.default_rng(0).permutation(len(rows))
        rs.assert_batch_equal(schema, [rows[i] for i in perm], r.take(perm))
        rs.assert_batch_equal(schema, [rows[-1], rows[0], rows[-1]], r.take([-1, 0, -1]))
        for i in (0, 22, 23, 27, 28, 44, 45, len(rows) - 1):
            got = r[i]
            for f in schema:
                rs.assert_value_equal(rows[i][f.name], got[f.name], f, f"row {i}: ")
        with pytest.raises(IndexError):
            r.take([len(rows)])


@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
def test_every_row_once_per_epoch_and_orders_deterministic(dataset, rs, shuffle):
    root, schema, rows = dataset
    with rowstore.open(root) as r:
        seen = []
        for batch in r.batches(8, shuffle=shuffle, seed=5, epoch=1, window=3, num_threads=2):
            seen.append(batch)
        got = rowstore.reader.buffers.concat_batches(seen)
        order = r.epoch_order(shuffle=shuffle, seed=5, epoch=1, window=3)
        assert sorted(order.tolist()) == list(range(len(rows)))
        rs.assert_batch_equal(schema, [rows[i] for i in order], got)
        assert np.array_equal(order, r.epoch_order(shuffle=shuffle, seed=5, epoch=1, window=3))
        if shuffle != "none":
            assert not np.array_equal(
                order, r.epoch_order(shuffle=shuffle, seed=5, epoch=2, window=3)
            )


def test_block_shuffle_mixes_blocks_of_different_shards(dataset):
    root, _, rows = dataset
    with rowstore.open(root) as r:
        order = r.epoch_order(shuffle="block", seed=1, window=4)
        shard_of = np.repeat(np.arange(len(SHARDS)), [s[0] for s in SHARDS])
        first_batch_shards = set(shard_of[order[:16]].tolist())
        assert len(first_batch_shards) >= 2
        # The block order is a permutation over all shards' blocks, not shard by shard.
        assert not np.array_equal(np.sort(shard_of[order]), shard_of[order])


@pytest.mark.parametrize("shuffle", ["block", "full"])
@pytest.mark.parametrize("even", [False, True])
def test_ddp_shards_are_disjoint_and_complete(dataset, shuffle, even):
    root, _, rows = dataset
    with rowstore.open(root) as r:
        parts = [r.epoch_order(shuffle=shuffle, seed=2, part=(k, 3), even=even) for k in range(3)]
        allrows = np.concatenate(parts)
        assert len(set(allrows.tolist())) == len(allrows)
        if even:
            assert all(len(p) == len(rows) // 3 for p in parts)
        else:
            assert sorted(allrows.tolist()) == list(range(len(rows)))
        for k in range(3):
            got = np.concatenate(
                [
                    b["label__null"]
                    for b in r.batches(5, shuffle=shuffle, seed=2, part=(k, 3), even=even)
                ]
            )
            assert len(got) == len(parts[k])


def test_resume_with_start(dataset, rs):
    root, schema, rows = dataset
    with rowstore.open(root) as r:
        order = r.epoch_order(shuffle="full", seed=9)
        rest = rowstore.reader.buffers.concat_batches(
            list(r.batches(6, shuffle="full", seed=9, start=31))
        )
        rs.assert_batch_equal(schema, [rows[i] for i in order[31:]], rest)


@pytest.mark.parametrize("verify", [True, False, "always"])
def test_verify_modes_read_the_same(dataset, rs, verify):
    root, schema, rows = dataset
    with rowstore.open(root, verify=verify) as r:
        rs.assert_batch_equal(
            schema, rows, rowstore.reader.buffers.concat_batches(list(r.batches(7, shuffle="none")))
        )


def test_a_list_of_files_and_datasets_reads_as_one(dataset, rs, tmp_path):
    root, schema, rows = dataset
    files = [os.path.join(root, M.SHARD_DIR, f"s{k:03d}.h5") for k in range(len(SHARDS))]
    with rowstore.open(files) as r:
        assert len(r) == len(rows) and r.layout.version is None
        rs.assert_batch_equal(schema, rows, r.take(np.arange(len(rows))))
        order = r.epoch_order(shuffle="block", seed=4, window=2)
    with rowstore.open(root) as r:  # the same layout gives the same order
        assert np.array_equal(order, r.epoch_order(shuffle="block", seed=4, window=2))
    with rowstore.open([root, files[0], root]) as r:
        assert len(r) == 2 * len(rows) + SHARDS[0][0]
        rs.assert_batch_equal(
            schema, rows[: SHARDS[0][0]], r.take(np.arange(len(rows), len(rows) + SHARDS[0][0]))
        )
    other = rs.write_file(tmp_path / "other.h5", rowstore.Schema({"x": "int64"}), [{"x": 1}])
    with pytest.raises(SchemaError, match="schemas differ"):
        rowstore.open([root, other])


def test_pickled_reader_reads_in_another_process(dataset, rs):
    root, schema, rows = dataset
    r = rowstore.open(root)
    r.take([0, len(rows) - 1])
    blob = pickle.dumps(r)
    assert len(blob) < 200_000
    r2 = pickle.loads(blob)
    rs.assert_batch_equal(schema, rows[:5], r2.take(np.arange(5)))
    code = f"""
        import pickle, sys
        r = pickle.loads(bytes.fromhex(sys.argv[1]))
        b = r.take(list(range({len(rows)})))
        print(int(b["label__null"].sum()), len(b["label"]))
    """
    proc = rs.run_python(code, blob.hex())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(sum(x["label"] is None for x in rows)), str(len(rows))]
    r.close()
    r2.close()


def test_descriptors_stay_bounded(dataset, rs):
    root, schema, rows = dataset
    with rowstore.open(root, max_open_files=2) as r:
        for shuffle in ("full", "block"):
            got = rowstore.reader.buffers.concat_batches(
                list(r.batches(16, shuffle=shuffle, seed=1, num_threads=2))
            )
            assert np.sort(got["label__null"].nonzero()[0]).size == sum(
                x["label"] is None
                for x in (rows[i] for i in r.epoch_order(shuffle=shuffle, seed=1))
            )
            assert r._store.open_count() <= 2
        rs.assert_batch_equal(schema, rows, r.take(np.arange(len(rows))))
        assert r._store.open_count() <= 2


def test_reader_of_version_k_is_unaffected_by_commit_of_k_plus_1(tmp_path, rs):
    schema = rs.all_kinds_schema()
    rows = rs.make_rows(schema, 40, seed=1)
    root = str(tmp_path / "ds")
    e, b, c, L = build(root, schema, rows[:20], shards=[(12, 5), (8, 5)])
    publish(root, schema, e, b, c, L)
    old = rowstore.open(root)
    e2, b2, c2, L2 = build(root, schema, rows[20:], shards=[(20, 6)])
    assert publish(root, schema, e + e2, b + b2, c + c2, L2) == 2
    new = rowstore.open(root)
    assert (len(old), len(new)) == (20, 40) and (old.layout.version, new.layout.version) == (1, 2)
    rs.assert_batch_equal(schema, rows[:20], old.take(np.arange(20)))
    rs.assert_batch_equal(schema, rows, new.take(np.arange(40)))
    with rowstore.open(root, version=1) as v1:
        assert len(v1) == 20
    old.close()
    new.close()


# -- damaged datasets ----------------------------------------------------------------------------
def _small(tmp_path, rs, compression=None):
    schema = rs.all_kinds_schema()
    rows = rs.make_rows(schema, 30, seed=2)
    root = str(tmp_path / "ds")
    e, b, c, L = build(root, schema, rows, shards=[(10, 4), (20, 4)], compression=compression)
    publish(root, schema, e, b, c, L)
    return root, schema, rows


def test_missing_or_resized_shard_is_a_format_error_naming_it(tmp_path, rs):
    root, _, rows = _small(tmp_path, rs)
    shard = os.path.join(root, M.SHARD_DIR, "s001.h5")
    with rowstore.open(root) as r:  # opening reads no shard
        with open(shard, "ab") as f:
            f.write(b"x")
        r.take([0])  # shard 0 is fine
        with pytest.raises(FormatError, match="s001.h5.*manifest records") as ei:
            r.take([15])
        assert ei.value.path == os.path.abspath(shard)
        os.remove(shard)
        with rowstore.open(root) as r2, pytest.raises(FormatError, match="s001.h5.*missing"):
            list(r2.batches(4))
    with rowstore.open(root) as r:
        damage = r.layout.damage()
    assert len(damage) == 1 and "s001.h5" in str(damage[0])


def test_corrupt_block_names_shard_block_and_rows(tmp_path, rs):
    root, _, rows = _small(tmp_path, rs)
    shard = os.path.join(root, M.SHARD_DIR, "s001.h5")
    L = Layout.open(shard)
    off = int(L.blocks["offset"][2])
    with open(shard, "r+b") as f:
        f.seek(off + 3)
        byte = f.read(1)
        f.seek(off + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    with rowstore.open(root) as r:
        with pytest.raises(rowstore.ChecksumError) as ei:
            r.take(np.arange(30))
        assert ei.value.path == os.path.abspath(shard) and ei.value.block == 2
        (err,) = r.layout.damage()
        assert err.rows == (10 + 8, 10 + 12) and err.block == 2


@pytest.mark.parametrize("target", ["pointer", "manifest", "sidecar"])
def test_corrupt_manifest_objects_are_format_errors(tmp_path, rs, target):
    root, _, _ = _small(tmp_path, rs)
    path = {"pointer": M.POINTER, "manifest": M.manifest_path(1), "sidecar": M.index_path(1)}[
        target
    ]
    full = os.path.join(root, path)
    data = bytearray(open(full, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(full, "wb").write(bytes(data))
    with pytest.raises(FormatError):
        rowstore.open(root)


def test_newer_manifest_version_is_refused_by_name(tmp_path, rs):
    root, _, _ = _small(tmp_path, rs)
    full = os.path.join(root, M.POINTER)
    obj = json.load(open(full))
    obj["format_version"] = 99
    open(full, "w").write(json.dumps(obj))
    with pytest.raises(FormatVersionError, match="v99.*upgrade"):
        rowstore.open(root)


def _rewrite_manifest(root, edit):
    """Edit manifest v1 and its sidecar and re-seal both checksums (a hostile, consistent one)."""
    mpath = os.path.join(root, M.manifest_path(1))
    m = json.load(open(mpath))
    side = bytearray(open(os.path.join(root, M.index_path(1)), "rb").read())
    side = edit(m, side) or side
    m["index"]["crc32"] = zlib.crc32(bytes(side))
    m["index"]["nbytes"] = len(side)
    open(os.path.join(root, M.index_path(1)), "wb").write(bytes(side))
    text = json.dumps(m).encode()
    open(mpath, "wb").write(text)
    p = json.load(open(os.path.join(root, M.POINTER)))
    p["manifest_crc32"] = zlib.crc32(text)
    open(os.path.join(root, M.POINTER), "w").write(json.dumps(p))


def test_hostile_but_sealed_manifests_are_refused(tmp_path, rs):
    root, _, _ = _small(tmp_path, rs)
    blocks_at = len(M.INDEX_MAGIC)

    def outside(m, side):  # a block offset beyond its file (index CRC re-sealed too)
        b = np.frombuffer(
            bytes(side[blocks_at:]), M.spec.BLOCK_DTYPE, count=sum(s["blocks"] for s in m["shards"])
        ).copy()
        b["offset"][0] = 1 << 40
        nb = len(b) * M.spec.BLOCK_DTYPE.itemsize
        side[blocks_at : blocks_at + nb] = b.tobytes()
        h = np.frombuffer(bytes(side[blocks_at + nb :]), M.spec.HEAP_CHUNK_DTYPE)
        nb0 = m["shards"][0]["blocks"]
        nh0 = m["shards"][0]["heap_chunks"]
        m["shards"][0]["index_crc32"] = M.index_crc32(b[:nb0], h[:nh0])

    _rewrite_manifest(root, outside)
    with pytest.raises(FormatError, match="lies outside the file"):
        rowstore.open(root)


@pytest.mark.parametrize("edit", ["escape", "absolute", "duplicate", "rows", "kind"])
def test_manifest_entries_are_checked(tmp_path, rs, edit):
    root, _, _ = _small(tmp_path, rs)

    def change(m, side):
        s = m["shards"]
        if edit == "escape":
            s[0]["path"] = "../elsewhere.h5"
        elif edit == "absolute":
            s[0]["path"] = "/etc/passwd"
        elif edit == "duplicate":
            s[1]["path"] = s[0]["path"]
        elif edit == "rows":
            s[0]["rows"] += 1
        else:
            m["kind"] = "mixture"

    _rewrite_manifest(root, change)
    with pytest.raises(FormatError):
        rowstore.open(root)


def test_directory_without_manifest_is_not_a_dataset(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="not a rowstore dataset"):
        rowstore.open(tmp_path / "empty")


def test_many_uniform_shards_under_a_small_descriptor_bound(tmp_path, rs):
    """Shards of one block size load in one kernel call, each chunk from its own descriptor;
    a request touching more shards than the bound is split, and descriptors stay bounded."""
    schema = rs.all_kinds_schema()
    rows = rs.make_rows(schema, 60, seed=4)
    root = str(tmp_path / "ds")
    e, b, c, L = build(root, schema, rows, shards=[(5, 2)] * 12)
    publish(root, schema, e, b, c, L)
    with rowstore.open(root, max_open_files=3) as r:
        assert r.layout.uniform_blocks and not r.layout.uniform
        perm = np.random.default_rng(1).permutation(60)
        rs.assert_batch_equal(schema, [rows[i] for i in perm], r.take(perm))
        assert r._store.open_count() <= 3
        for shuffle in ("block", "full"):
            order = r.epoch_order(shuffle=shuffle, seed=3, window=5)
            got = rowstore.reader.buffers.concat_batches(
                list(r.batches(7, shuffle=shuffle, seed=3, window=5))
            )
            rs.assert_batch_equal(schema, [rows[i] for i in order], got)
            assert r._store.open_count() <= 3


def test_many_shards_under_a_low_ulimit(tmp_path, rs):
    """600 shard files read in a process allowed 256 descriptors: the default bound (a quarter
    of the limit) keeps every read under it (full shuffle touches hundreds of shards per
    request: those requests are split)."""
    schema = rowstore.Schema({"x": "int64"})
    root = tmp_path / "many"
    (root / M.SHARD_DIR).mkdir(parents=True)
    one = rs.write_file(tmp_path / "one.h5", schema, [{"x": i} for i in range(5)], rows_per_block=2)
    L = Layout.open(one)
    n = 600
    entries = []
    for k in range(n):  # hard links: many shard files, cheaply
        rel = f"{M.SHARD_DIR}/p{k:04d}.h5"
        os.link(one, root / rel)
        entries.append(M.shard_entry(rel, L))
    publish(str(root), schema, entries, [L.blocks] * n, [L.heap_chunks] * n, L)
    code = f"""
        import resource, numpy as np, rowstore
        resource.setrlimit(resource.RLIMIT_NOFILE, (256,
        resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        r = rowstore.open({str(root)!r})
        total = 0
        for shuffle in ("full", "block"):
            xs = np.concatenate([b["x"] for b in r.batches(1000, shuffle=shuffle, seed=1,
            num_threads=2)])
            assert sorted(xs.tolist()) == sorted(list(range(5)) * {n}), shuffle
            total += len(xs)
        assert r.take(np.arange(len(r)))["x"].tolist() == list(range(5)) * {n}
        print(total, r._store.max_open, r._store.open_count())
    """
    proc = rs.run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    total, bound, held = map(int, proc.stdout.split())
    assert total == 2 * 5 * n and bound == 64 and held <= bound
