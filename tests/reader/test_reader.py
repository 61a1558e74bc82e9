"""The reader returns exactly what was written, in the promised orders, safely."""

import multiprocessing as mp
import os
import pickle
import shutil

import h5py
import numpy as np
import pytest
from helpers import flip_byte

import rowstore as rs
from rowstore.errors import ChecksumError, FormatError
from rowstore.reader import Ragged

SCHEMA = rs.Schema(
    [
        rs.Field("x", "float32", (3, 2)),
        rs.Field("label", "int64"),
        rs.Field("flag", "bool"),
        rs.Field("maybe", "int16", nullable=True),
        rs.Field("text", rs.STR, nullable=True),
        rs.Field("blob", rs.BYTES),
        rs.Field("wave", "float32", (None,)),
        rs.Field("grid", "uint16", (None, 3, None), nullable=True),
        rs.Field("img", "uint8", (8, 6, 3), codec="png"),
        rs.Field("vimg", "uint8", (None, None), codec={"id": "png", "level": 1}),
    ]
)


def make_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        rows.append(
            {
                "x": rng.standard_normal((3, 2)).astype(np.float32),
                "label": i,
                "flag": bool(i % 2),
                "maybe": None if i % 4 == 0 else int(rng.integers(-1000, 1000)),
                "text": None if i % 7 == 3 else "é" * (i % 5) + f"row{i}",
                "blob": bytes(rng.integers(0, 256, i % 9, dtype=np.uint8)),
                "wave": rng.standard_normal(int(rng.integers(0, 30))).astype(np.float32),
                "grid": None
                if i % 5 == 1
                else rng.integers(
                    0, 60000, (int(rng.integers(0, 4)), 3, int(rng.integers(1, 3))), dtype=np.uint16
                ),
                "img": rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
                "vimg": rng.integers(
                    0, 256, (int(rng.integers(1, 9)), int(rng.integers(1, 9))), dtype=np.uint8
                ),
            }
        )
    return rows


ROWS = make_rows(257)


@pytest.fixture(scope="module", params=[None, "lz4", "zstd"])
def dataset(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("r") / f"d-{request.param}.h5")
    with rs.Writer(
        path, SCHEMA, compression=request.param, block_bytes=2000, heap_chunk_bytes=512
    ) as w:
        for r in ROWS[:100]:
            w.write(r)
        cols = {k: [r[k] for r in ROWS[100:]] for k in SCHEMA.names}
        cols["x"] = np.stack(cols["x"])
        w.write_batch(cols)
    return path


def assert_row_equal(got, want):
    for k, v in want.items():
        g = got[k]
        if v is None:
            assert g is None, k
        elif isinstance(v, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == v.dtype and g.shape == v.shape, (
                k,
                g,
                v,
            )
            assert np.array_equal(g, v), k
        else:
            assert g == v, k


def unbatch(batch, schema, i):
    row = {}
    for f in schema:
        v = batch[f.name][i]
        if f.nullable and batch[f.name + "__null"][i]:
            v = None
        elif isinstance(v, np.generic):
            v = v.item()
        row[f.name] = v
    return row


def test_layout(dataset):
    r = rs.open(dataset)
    assert len(r) == 257 and r.schema == SCHEMA
    assert r.layout.num_blocks > 5
    assert r.layout.heap_nbytes > 0 and len(r.layout.heap_chunks) > 3


def test_bytes_path_is_kept_as_str(dataset):
    # as_reader (the adapters' entry) takes bytes paths; the reader and its errors carry a str.
    from rowstore.reader.dataset import as_reader

    r, owned = as_reader(os.fsencode(dataset))
    assert owned and r.path == os.fspath(dataset) and len(r) == 257
    r.close()


def test_getitem_every_row(dataset):
    r = rs.open(dataset)
    for i in range(len(r)):
        got = r[i]
        want = dict(ROWS[i])
        got = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in got.items()}
        assert_row_equal(got, want)
    assert_row_equal(
        {k: (v.item() if isinstance(v, np.generic) else v) for k, v in r[-1].items()}, ROWS[-1]
    )
    with pytest.raises(IndexError):
        r[257]


@pytest.mark.parametrize("verify", [True, False])
def test_take_any_order_with_repeats(dataset, verify):
    r = rs.open(dataset, verify=verify)
    idx = np.random.default_rng(5).integers(0, 257, 600)
    b = r.take(idx)
    assert b["x"].shape == (600, 3, 2) and b["x"].dtype == np.float32
    assert b["img"].shape == (600, 8, 6, 3)
    assert isinstance(b["wave"], Ragged) and isinstance(b["grid"], Ragged)
    assert b["text"].dtype == object
    for j, i in enumerate(idx):
        assert_row_equal(unbatch(b, SCHEMA, j), ROWS[i])


def test_take_fields_padded_and_out(dataset):
    r = rs.open(dataset)
    idx = [5, 3, 250, 3]
    b = r.take(idx, fields=["wave", "label"], varlen="padded")
    assert set(b) == {"wave", "wave__shape", "label"}
    lens = b["wave__shape"][:, 0]
    for j, i in enumerate(idx):
        assert lens[j] == len(ROWS[i]["wave"])
        assert np.array_equal(b["wave"][j, : lens[j]], ROWS[i]["wave"])
        assert not b["wave"][j, lens[j] :].any()
    out = {"x": np.full((4, 3, 2), -1, np.float32)}
    b = r.take(idx, fields=["x"], out=out)
    assert b["x"] is out["x"]
    assert np.array_equal(out["x"], np.stack([ROWS[i]["x"] for i in idx]))
    with pytest.raises(ValueError):
        r.take(idx, fields=["x"], out={"x": np.empty((4, 3, 2), np.float64)})
    with pytest.raises(ValueError):
        r.take(idx, fields=["x"], out={"x": np.empty((5, 3, 2), np.float32)})
    with pytest.raises(ValueError):
        r.take(idx, fields=["x"], out={"wave": np.empty(4, np.float32)})
    b = r.take([], fields=["x", "text", "wave"])
    assert b["x"].shape == (0, 3, 2) and len(b["wave"]) == 0 and len(b["text"]) == 0


@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
@pytest.mark.parametrize("threads", [1, 2])
def test_batches_cover_epoch_in_order(dataset, shuffle, threads):
    r = rs.open(dataset)
    expect = r.epoch_order(shuffle=shuffle, seed=3, epoch=1, window=2)
    got = []
    for b in r.batches(
        32,
        shuffle=shuffle,
        seed=3,
        epoch=1,
        window=2,
        num_threads=threads,
        fields=["label", "text", "wave"],
    ):
        assert len(b["label"]) <= 32
        got.append(b["label"])
        for j, i in enumerate(b["label"]):
            assert b["text"][j] == ROWS[i]["text"]
            assert np.array_equal(b["wave"][j], ROWS[i]["wave"])
    got = np.concatenate(got)
    assert np.array_equal(got, expect)
    assert sorted(got) == list(range(257))


def test_batches_drop_last_shards_and_start(dataset):
    r = rs.open(dataset)
    sizes = [len(b["label"]) for b in r.batches(50, drop_last=True, fields=["label"])]
    assert sizes == [50] * 5
    assert r.num_batches(50, drop_last=True) == 5 and r.num_batches(50) == 6
    seen = []
    for rank in range(3):
        part = np.concatenate(
            [b["label"] for b in r.batches(16, part=(rank, 3), fields=["label"], window=3)]
        )
        assert np.array_equal(part, r.epoch_order(part=(rank, 3), window=3))
        seen.append(part)
    assert sorted(np.concatenate(seen)) == list(range(257))
    full = np.concatenate([b["label"] for b in r.batches(16, fields=["label"], seed=9)])
    rest = np.concatenate([b["label"] for b in r.batches(16, fields=["label"], seed=9, start=40)])
    assert np.array_equal(rest, full[40:])


def test_batches_padded_mode_matches_ragged(dataset):
    r = rs.open(dataset, varlen="padded")
    for b in r.batches(40, fields=["label", "grid", "vimg"], shuffle="none"):
        for j, i in enumerate(b["label"]):
            g = ROWS[i]["grid"]
            if g is None:
                assert b["grid__null"][j]
                continue
            s = b["grid__shape"][j]
            assert tuple(s) == (g.shape[0], g.shape[2])
            assert np.array_equal(b["grid"][j][: s[0], :, : s[1]], g)
            v = ROWS[i]["vimg"]
            assert np.array_equal(b["vimg"][j][: v.shape[0], : v.shape[1]], v)


def test_arrays_are_owned_by_caller(dataset):
    r = rs.open(dataset)
    batches = list(r.batches(16, fields=["x", "label"], num_threads=2))
    kept = [b["label"].copy() for b in batches]
    for b, k in zip(batches, kept):
        assert np.array_equal(b["label"], k)  # not overwritten by later batches


def test_pickle_and_threads(dataset):
    r = rs.open(dataset)
    r2 = pickle.loads(pickle.dumps(r))
    assert len(r2) == len(r)
    a = r2.take([1, 2, 3], fields=["label"])["label"]
    assert a.tolist() == [1, 2, 3]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda i: r.take([i, 256 - i], fields=["label", "blob"]), range(100)))
    for i, b in enumerate(outs):
        assert b["label"].tolist() == [i, 256 - i]
        assert b["blob"][0] == ROWS[i]["blob"]


def _child(r, q, seed):
    labels = np.concatenate(
        [b["label"] for b in r.batches(20, seed=seed, fields=["label", "wave"])]
    )
    q.put(labels.tolist())


def test_fork_children_of_a_parent_that_already_read(dataset):
    r = rs.open(dataset)
    before = r.take([0, 100], fields=["label"])  # the parent opened its descriptor
    assert before["label"].tolist() == [0, 100]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, q, s)) for s in (1, 2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for res in results:
        assert sorted(res) == list(range(257))
    assert r.take([5], fields=["label"])["label"].tolist() == [5]  # parent still fine


def test_spawn_child(dataset):
    r = rs.open(dataset)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(r, q, 4))
    p.start()
    res = q.get(timeout=120)
    p.join(timeout=60)
    assert sorted(res) == list(range(257))


def test_bad_arguments(dataset):
    r = rs.open(dataset)
    with pytest.raises(ValueError):
        next(r.batches(0))
    with pytest.raises(ValueError):
        r.batches(4, shuffle="random")
    with pytest.raises(rs.SchemaError):
        r.take([0], fields=["nope"])
    with pytest.raises(TypeError):
        r.take([0.5])
    with pytest.raises(ValueError):
        rs.open(dataset, varlen="nested")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"epoch": True}, "epoch"),
        ({"epoch": -1}, "epoch"),
        ({"seed": False}, "seed"),
        ({"window": True}, "window"),
        ({"window": 0}, "window"),
    ],
)
def test_batches_rejects_bools_and_bad_counts(dataset, kwargs, name):
    r = rs.open(dataset)
    kwargs = {"batch_size": 4, **kwargs}
    with pytest.raises(ValueError, match=f"^{name} must be a (positive|non-negative) int"):
        r.batches(kwargs.pop("batch_size"), **kwargs)
    assert len(next(r.batches(np.int64(4), epoch=np.int32(1), window=np.uint8(2)))["label"]) == 4


# -- corruption -----------------------------------------------------------------------------
def corrupt_copy(src, dst, mutate):
    shutil.copyfile(src, dst)
    mutate(dst)
    return dst


def test_flipped_byte_in_block_is_detected(dataset, tmp_path):
    L = rs.Layout.open(dataset)
    off = int(L.blocks["offset"][3]) + int(L.blocks["stored_nbytes"][3]) // 2
    bad = corrupt_copy(dataset, str(tmp_path / "bad.h5"), lambda p: flip_byte(p, off))
    r = rs.open(bad)
    with pytest.raises(ChecksumError) as ei:
        r.take(np.arange(len(r)))
    assert ei.value.block == 3
    with pytest.raises(ChecksumError):
        for _ in r.batches(10):
            pass
    # rows of other blocks still read
    assert r.take([0], fields=["label"])["label"].tolist() == [0]
    with pytest.raises(ChecksumError):
        rs.Layout.open(bad, scan=True)


def test_flipped_heap_byte_is_detected(dataset, tmp_path):
    L = rs.Layout.open(dataset)
    off = int(L.heap_chunks["offset"][1]) + 3
    bad = corrupt_copy(dataset, str(tmp_path / "badheap.h5"), lambda p: flip_byte(p, off))
    with pytest.raises(FormatError):
        rs.open(bad).take(np.arange(257), fields=["blob", "wave", "text", "img", "vimg", "grid"])


def test_hostile_heap_reference_is_caught_without_checksums(dataset, tmp_path):
    """Even with verify=False, a row pointing outside its block's heap range is an error."""
    L = rs.Layout.open(dataset)
    if L.compressed:
        pytest.skip("row bytes of compressed blocks cannot be edited in place")
    row = 7
    b, r_in = divmod(row, L.rows_per_block)
    field_off = L.row_dtype.fields["blob"][1]
    pos = int(L.blocks["offset"][b]) + r_in * L.row_dtype.itemsize + field_off

    def mutate(p):
        with open(p, "r+b") as f:
            f.seek(pos)
            f.write(np.array([10**12], "<u8").tobytes())

    bad = corrupt_copy(dataset, str(tmp_path / "hostile.h5"), mutate)
    r = rs.open(bad, verify=False)
    with pytest.raises(FormatError, match="heap range"):
        r.take([row], fields=["blob"])
    for shuffle in ("full", "block"):
        with pytest.raises(FormatError):
            for _ in r.batches(300, fields=["blob"], shuffle=shuffle):
                pass


def _point_rows_at(path, field, ref):
    """Rewrite every row's reference of ``field`` in block 0 (uncompressed) to ``ref(i)``."""
    L = rs.Layout.open(path)
    rs_, off = L.row_dtype.itemsize, L.row_dtype.fields[field][1]
    with open(path, "r+b") as f:
        for i in range(L.rows_per_block):
            f.seek(int(L.blocks["offset"][0]) + i * rs_ + off)
            f.write(np.array(ref(L, i), "<u8").tobytes())


@pytest.mark.parametrize("target", ["whole range", "one payload"])
def test_rows_sharing_a_payload_cannot_multiply_memory(tmp_path, target):
    """Rows whose references each lie in their block's heap range but overlap (all on the whole
    range, or all on one payload) are refused before the batch allocates n times the heap."""
    import tracemalloc

    path = str(tmp_path / "shared.h5")
    schema = rs.Schema([rs.Field("id", "int64"), rs.Field("blob", rs.BYTES)])
    with rs.Writer(path, schema, rows_per_block=64) as w:
        for i in range(128):
            w.write({"id": i, "blob": bytes([i]) * 16384})
    L = rs.Layout.open(path)
    lo, hi = int(L.blocks["heap_start"][0]), int(L.blocks["heap_end"][0])
    if target == "whole range":
        _point_rows_at(path, "blob", lambda L, i: [lo, hi - lo])
    else:
        _point_rows_at(path, "blob", lambda L, i: [lo, 16384])
    r = rs.open(path, verify=False)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="overlaps") as ei:
            for _ in r.batches(64, fields=["blob"]):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ei.value.field == "blob" and ei.value.block == 0
    assert peak < 8 * (hi - lo), peak  # a batch of 64 overlapping rows would need 64 times that
    with pytest.raises(FormatError, match="overlaps"):
        r.take(np.arange(64), fields=["blob"])
    # rows of the other block, and a row asked for more than once, still read
    assert r.take([64, 64, 65], fields=["blob"])["blob"].tolist() == [b"@" * 16384] * 2 + [
        b"A" * 16384
    ]


def test_hostile_index_offsets_rejected_at_open(dataset, tmp_path):
    def mutate(p):
        with h5py.File(p, "r+") as f:
            blocks = f["rowstore/blocks"][()]
            blocks["offset"][2] = os.path.getsize(p) + 10
            f["rowstore/blocks"][...] = blocks

    bad = corrupt_copy(dataset, str(tmp_path / "idx.h5"), mutate)
    with pytest.raises(FormatError, match="outside the file"):
        rs.open(bad)

    def mutate2(p):
        with h5py.File(p, "r+") as f:
            blocks = f["rowstore/blocks"][()]
            blocks["heap_end"][1] += 1
            f["rowstore/blocks"][...] = blocks

    bad2 = corrupt_copy(dataset, str(tmp_path / "idx2.h5"), mutate2)
    with pytest.raises(FormatError, match="heap ranges"):
        rs.open(bad2)


def test_truncated_file(dataset, tmp_path):
    size = os.path.getsize(dataset)
    for cut in (size - 1, size // 2, 1000, 10):
        p = str(tmp_path / f"cut{cut}.h5")
        shutil.copyfile(dataset, p)
        os.truncate(p, cut)
        with pytest.raises((FormatError, OSError)):
            r = rs.open(p)
            r.take(np.arange(len(r)))


def test_file_replaced_after_open(dataset, tmp_path):
    p = str(tmp_path / "moving.h5")
    shutil.copyfile(dataset, p)
    r = rs.open(p)
    with open(p, "ab") as f:
        f.write(b"x" * 100)
    with pytest.raises(FormatError, match="changed since it was opened"):
        r.take([0])


def test_reader_opened_before_an_atomic_rewrite(dataset, tmp_path):
    """A writer replaces the file (same size, new inode): a reader that had not read yet refuses
    to mix the old index with the new file; one that had read keeps reading its version."""
    p = str(tmp_path / "rewritten.h5")
    shutil.copyfile(dataset, p)
    early = rs.open(p)
    early.take([0], fields=["label"])  # descriptor open on the old version
    late = rs.open(p)
    shutil.copyfile(dataset, p + ".new")
    os.replace(p + ".new", p)  # what Writer.close does: same bytes, another inode
    assert early.take([5], fields=["label"])["label"].tolist() == [5]
    with pytest.raises(FormatError, match="changed since it was opened"):
        late.take([0], fields=["label"])
    assert rs.open(p).take([7], fields=["label"])["label"].tolist() == [7]


@pytest.mark.parametrize("syscall_cost", [0.0, 1.0])
def test_both_heap_paths_give_the_same_rows(dataset, monkeypatch, syscall_cost):
    """Uncompressed heaps are read either payload by payload or by heap chunks, by a cost
    estimate; force each path and compare with what was written."""
    import rowstore.reader._gather as D  # the cost model

    monkeypatch.setattr(D, "_SYSCALL_S", syscall_cost)
    r = rs.open(dataset)
    idx = np.random.default_rng(9).permutation(257)[:120]
    b = r.take(idx)
    for j, i in enumerate(idx):
        assert_row_equal(unbatch(b, SCHEMA, j), ROWS[i])
    got = np.concatenate(
        [bt["label"] for bt in r.batches(64, fields=["label", "blob", "wave"], window=3)]
    )
    assert sorted(got) == list(range(257))
    # fixed-size fields only: uncompressed files may read each row straight into the arrays
    b = r.take(idx, fields=["x", "maybe", "label"])
    for j, i in enumerate(idx):
        assert np.array_equal(b["x"][j], ROWS[i]["x"]) and b["label"][j] == i
        assert b["maybe__null"][j] == (ROWS[i]["maybe"] is None)
        assert ROWS[i]["maybe"] is None or b["maybe"][j] == ROWS[i]["maybe"]
    for shuffle in ("block", "full"):
        got = np.concatenate(
            [bt["label"] for bt in r.batches(50, fields=["x", "label"], shuffle=shuffle, window=2)]
        )
        assert np.array_equal(got, r.epoch_order(shuffle=shuffle, window=2))


def test_verify_always_checksums_rows_read_directly(dataset, tmp_path):
    """Uncompressed files may be read row by row (not checksummed); verify='always' reads whole
    chunks so a flipped byte in a row is caught whatever the access pattern."""
    L = rs.Layout.open(dataset)
    if L.compressed:
        pytest.skip("compressed blocks are always read whole")
    off = int(L.blocks["offset"][2]) + L.row_dtype.fields["x"][1] + 2  # inside row 2*R's x value
    bad = corrupt_copy(dataset, str(tmp_path / "flip.h5"), lambda p: flip_byte(p, off))
    row = 2 * L.rows_per_block
    with pytest.raises(ChecksumError):
        rs.open(bad, verify="always").take([row], fields=["x"])
    # bounds still hold without checksums: the value is read, never outside its row
    assert rs.open(bad, verify=False).take([row], fields=["x"])["x"].shape == (1, 3, 2)
    with pytest.raises(ValueError):
        rs.open(dataset, verify="sometimes")


@pytest.mark.parametrize("big", [False, True])
def test_pad_ragged_matches_reference(big):
    from rowstore.reader.buffers import pad_ragged

    rng = np.random.default_rng(3 + big)
    for _ in range(100):
        nd = int(rng.integers(1, 4))
        n = int(rng.integers(0, 6))
        hi = 40 if big else 4
        arrs = [
            rng.integers(0, 100, tuple(int(x) for x in rng.integers(0, hi, nd))) for _ in range(n)
        ]
        vals = np.concatenate([a.ravel() for a in arrs]) if n else np.zeros(0, np.int64)
        off = np.zeros(n + 1, np.int64)
        np.cumsum([a.size for a in arrs], out=off[1:])
        shapes = np.array([a.shape for a in arrs], np.int64).reshape(n, nd)
        got = pad_ragged(Ragged(vals, off, shapes), fill=-1)
        maxs = tuple(int(m) for m in (shapes.max(axis=0) if n else np.zeros(nd, np.int64)))
        want = np.full((n,) + maxs, -1)
        for i, a in enumerate(arrs):
            want[(i,) + tuple(slice(0, k) for k in a.shape)] = a
        assert got.shape == want.shape and np.array_equal(got, want)


def test_ragged_take_matches_reference():
    from rowstore.reader.buffers import offsets_from_lengths

    rng = np.random.default_rng(11)
    for _ in range(200):
        nd = int(rng.integers(1, 4))
        n = int(rng.integers(0, 8))
        rows = [
            rng.integers(-99, 99, tuple(int(x) for x in rng.integers(0, 4, nd))) for _ in range(n)
        ]
        vals = np.concatenate([a.ravel() for a in rows]) if n else np.zeros(0, np.int64)
        shapes = np.array([a.shape for a in rows], np.int64).reshape(n, nd)
        r = Ragged(vals, offsets_from_lengths([a.size for a in rows]), shapes)
        # Any order, repeats, negative indices; sometimes none at all.
        idx = rng.integers(-n, n, int(rng.integers(0, 12))) if n else np.zeros(0, np.int64)
        got = r.take(idx)
        want = [rows[int(i)] for i in idx]  # the reference: a Python list of rows
        assert len(got) == len(want) and got.dtype == r.dtype
        assert got.offsets.tolist() == [0] + np.cumsum([a.size for a in want]).tolist()
        for g, w in zip(got, want):
            assert g.shape == w.shape and np.array_equal(g, w)
        if n:
            got.values[:] = 0  # a copy: the source is untouched
            assert np.array_equal(r.values, np.concatenate([a.ravel() for a in rows]))
            with pytest.raises(IndexError):
                r.take([n])
    assert len(Ragged(np.zeros(0), np.zeros(1, np.int64), np.zeros((0, 1), np.int64)).take([])) == 0


def test_more_bad_arguments_are_refused(dataset):
    r = rs.open(dataset)
    with pytest.raises(ValueError, match="varlen"):
        r.take([0], varlen="nested")
    with pytest.raises(ValueError, match="batch_size"):
        r.num_batches(0)
    with pytest.raises(ValueError, match="start"):
        r.num_batches(4, start=-1)
    with pytest.raises(ValueError, match="start"):
        r.batches(4, start=-2)
    with pytest.raises(ValueError, match="prefetch"):
        r.batches(4, prefetch=0)
    with pytest.raises(ValueError, match="part"):
        r.batches(4, part=(True, 2))
    with pytest.raises(ValueError, match="part"):
        r.shard_size(part=(2, 2))


def _child_images(r, q):
    got = np.concatenate(
        [b["label"] for b in r.batches(40, fields=["label", "img"], num_threads=2)]
    )
    imgs_ok = all(
        np.array_equal(r.take([i], fields=["img"])["img"][0], ROWS[i]["img"]) for i in (0, 100, 256)
    )
    q.put((sorted(got.tolist()), imgs_ok))


def test_image_decode_threads_work_in_forked_children(dataset):
    """The decode thread pool, created by a parent that already decoded, is recreated in a fork."""
    r = rs.open(dataset, num_threads=2)
    b = r.take(np.arange(257), fields=["img", "label"])  # parent decodes on its threads
    assert all(np.array_equal(b["img"][i], ROWS[i]["img"]) for i in range(257))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_images, args=(r, q))
    p.start()
    labels, ok = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0 and ok and labels == list(range(257))
    r.close()
    assert r.take([3], fields=["img"])["img"].shape == (1, 8, 6, 3)  # reopens after close
