"""rowstore.tf: tf.data datasets from rowstore files (round trips, signatures, shards, order)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before tensorflow is imported
tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("rowstore.tf")

import rowstore  # noqa: E402
from rowstore import BYTES, STR, Field, Schema, Writer  # noqa: E402

N_ROWS = 83  # not a multiple of the batch sizes or block size used below
RPB = 8  # rows per block: ~11 blocks

SCALARS = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def _schema() -> Schema:
    fields = [Field("id", "int64")]
    fields += [Field(f"s_{dt}", dt) for dt in SCALARS]
    fields += [
        Field("arr", "float32", (3, 2)),
        Field("arr_u16", "uint16", (4,)),
        Field("arr_c", "complex64", (2,)),
        Field("img", "uint8", (6, 5, 3), codec="png"),
        Field("v1", "float32", (None,)),
        Field("v1_u8", "uint8", (None,)),
        Field("v1_c", "complex128", (None,)),
        Field("vm", "uint16", (None, 3, None)),  # variable, fixed, variable
        Field("vtail", "float64", (None, 4)),  # fixed dimensions after the last variable one
        Field("vfirst", "int32", (2, None)),  # fixed dimension first
        Field("text", STR),
        Field("blob", BYTES),
        Field("n_text", STR, nullable=True),
        Field("n_blob", BYTES, nullable=True),
        Field("n_int", "int32", nullable=True),
        Field("n_arr", "float32", (2,), nullable=True),
        Field("n_var", "int16", (None, 2), nullable=True),
    ]
    return Schema(fields)


def _row(i: int, rng: np.random.Generator) -> dict:
    row: dict = {"id": i}
    for dt in SCALARS:
        if dt == "bool":
            row[f"s_{dt}"] = bool(i % 3 == 0)
        elif dt.startswith("complex"):
            row[f"s_{dt}"] = np.array(i + 0.5j * i, dtype=dt)
        elif dt.startswith("uint"):
            info = np.iinfo(dt)
            row[f"s_{dt}"] = np.array(info.max - i, dtype=dt)  # the top of the range
        elif dt.startswith("int"):
            row[f"s_{dt}"] = np.array(np.iinfo(dt).min + i, dtype=dt)
        else:
            row[f"s_{dt}"] = np.array(i / 7, dtype=dt)
    row["arr"] = rng.standard_normal((3, 2)).astype(np.float32)
    row["arr_u16"] = rng.integers(0, 65535, 4).astype(np.uint16)
    row["arr_c"] = (rng.standard_normal(2) + 1j * rng.standard_normal(2)).astype(np.complex64)
    row["img"] = rng.integers(0, 255, (6, 5, 3)).astype(np.uint8)
    row["v1"] = rng.standard_normal(i % 5).astype(np.float32)  # includes empty rows
    row["v1_u8"] = rng.integers(0, 255, (i * 7) % 11).astype(np.uint8)
    row["v1_c"] = (rng.standard_normal(i % 3) * 1j).astype(np.complex128)
    # (0, 3, k) and (k, 3, 0): empty values whose other dimensions still matter
    row["vm"] = rng.integers(0, 65535, (i % 3, 3, (i * 5) % 4)).astype(np.uint16)
    row["vtail"] = rng.standard_normal((i % 4, 4))
    row["vfirst"] = rng.integers(-100, 100, (2, (i * 3) % 5)).astype(np.int32)
    row["text"] = ["", "plain", "données", "wörld ✓", "日本語テキスト", "emoji 🎉"][i % 6] + str(i)
    row["blob"] = bytes([i % 256, 0, 255]) * (i % 4)
    row["n_text"] = None if i % 4 == 1 else f"é{i}"
    row["n_blob"] = None if i % 3 == 2 else b"\x00\x01" * i
    row["n_int"] = None if i % 5 == 0 else i * 1000
    row["n_arr"] = None if i % 2 else np.array([i, -i], np.float32)
    row["n_var"] = None if i % 3 == 0 else np.full((i % 4, 2), i, np.int16)
    return row


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(path, rows as the reader returns them) of a file with every kind of field."""
    path = str(tmp_path_factory.mktemp("tf") / "all.h5")
    rng = np.random.default_rng(42)
    with Writer(path, _schema(), rows_per_block=RPB) as w:
        for i in range(N_ROWS):
            w.write(_row(i, rng))
    r = rowstore.open(path)
    return path, [r[i] for i in range(N_ROWS)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small tabular file (float32[16] + label + id) spread over many blocks."""
    path = str(tmp_path_factory.mktemp("tf") / "tiny.h5")
    schema = Schema([Field("id", "int64"), Field("x", "float32", (16,)), Field("label", "int64")])
    n = 1000
    with Writer(path, schema, rows_per_block=16) as w:
        w.write_batch(
            {
                "id": np.arange(n),
                "x": np.random.default_rng(0).standard_normal((n, 16), dtype=np.float32),
                "label": np.arange(n) % 10,
            }
        )
    return path


# -- helpers ----------------------------------------------------------------------------------
def _ids(ds, batched: bool = True) -> list[int]:
    out: list[int] = []
    for el in ds:
        v = el["id"].numpy()
        out.extend(v.tolist() if batched else [int(v)])
    return out


def _np(v):
    if isinstance(v, tf.RaggedTensor):
        return v
    return v.numpy()


def _assert_same_value(field: Field, got, want, *, where: str) -> None:
    """Compare one row's value from TF with the reader's (None for nulls)."""
    if field.dtype in (STR, BYTES):
        assert isinstance(got, bytes), where
        if want is None:
            assert got == b"", where
        else:
            exp = want.encode("utf-8") if field.dtype == STR else want
            assert got == exp, where
        return
    got = np.asarray(got)
    if want is None:
        want = np.zeros([0 if d is None else d for d in field.shape], field.dtype)
        if field.is_variable:
            assert got.size == 0, where
            return
    want = np.asarray(want)
    assert got.dtype == want.dtype.newbyteorder("="), where
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    np.testing.assert_array_equal(got, want, err_msg=where)


def _check_rows_batch(el: dict, rows: list[dict], schema: Schema, varlen: dict[str, str]) -> int:
    """Check one batch (dict of tensors) against the reader's rows; returns its size."""
    ids = el["id"].numpy()
    for f in schema:
        v = el[f.name]
        for j, i in enumerate(ids):
            where = f"field {f.name} row {i}"
            want = rows[i][f.name]
            if f.is_variable and varlen.get(f.name, "ragged") == "ragged":
                assert isinstance(v, tf.RaggedTensor), where
                got = v[j]
                if isinstance(got, tf.RaggedTensor):
                    # Nested lists: to_tensor() cannot rebuild inner sizes of empty rows.
                    assert got.dtype == tf.as_dtype(f.dtype.newbyteorder("=")), where
                    want = np.zeros([0] + list(f.shape[1:]), f.dtype) if want is None else want
                    assert got.to_list() == want.tolist(), where
                else:
                    _assert_same_value(f, got.numpy(), want, where=where)
            elif f.is_variable:  # padded
                shape = el[f.name + "__shape"].numpy()[j]
                full = [0 if d is None else d for d in f.shape]
                for d, s in zip(f.variable_dims, shape):
                    full[d] = s
                row = v[j].numpy()
                region = tuple(slice(0, s) for s in full)
                _assert_same_value(f, row[region], want, where=where)
                rest = row.copy()
                rest[region] = 0
                assert not rest.any(), f"{where}: padding is not zero"
            else:
                _assert_same_value(f, _np(v)[j], want, where=where)
            if f.nullable:
                assert bool(el[f.name + "__null"].numpy()[j]) == (want is None), where
    return len(ids)


# -- signatures ---------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size,drop_last", [(None, False), (16, False), (16, True)])
@pytest.mark.parametrize("varlen", ["ragged", "padded"])
def test_element_spec_matches_schema(data, batch_size, drop_last, varlen):
    path, _ = data
    schema = rowstore.open(path).schema
    ds = rtf.make_dataset(path, batch_size=batch_size, drop_last=drop_last, varlen=varlen)
    spec = ds.element_spec
    assert spec == rtf.output_signature(
        schema, batch_size=batch_size, drop_last=drop_last, varlen=varlen
    )
    lead = [] if batch_size is None else [batch_size if drop_last else None]
    expected_keys = set()
    for f in schema:
        s = spec[f.name]
        expected_keys.add(f.name)
        want_dtype = (
            tf.string if f.dtype in (STR, BYTES) else tf.as_dtype(f.dtype.newbyteorder("="))
        )
        assert s.dtype == want_dtype, f.name
        assert s.shape.as_list() == lead + list(f.shape), f.name
        if f.is_variable and batch_size is not None and varlen == "ragged":
            assert isinstance(s, tf.RaggedTensorSpec), f.name
            # Ragged up to the last variable dimension; the fixed ones after it stay dense.
            assert s.ragged_rank == 1 + max(f.variable_dims), f.name
            assert s == f.tf_spec(batch_size if drop_last else -1), f.name
        else:
            assert isinstance(s, tf.TensorSpec), f.name
            if not f.is_variable:
                ref = f.tf_spec(None if batch_size is None else (batch_size if drop_last else -1))
                assert (s.shape, s.dtype) == (ref.shape, ref.dtype), f.name
        if f.is_variable and batch_size is not None and varlen == "padded":
            expected_keys.add(f.name + "__shape")
            assert spec[f.name + "__shape"] == tf.TensorSpec(
                lead + [len(f.variable_dims)], tf.int64
            )
        if f.nullable:
            expected_keys.add(f.name + "__null")
            assert spec[f.name + "__null"] == tf.TensorSpec(lead, tf.bool)
    assert set(spec) == expected_keys


def test_fields_selection(data):
    path, rows = data
    ds = rtf.make_dataset(path, batch_size=10, fields=["id", "n_text", "vm"], shuffle="none")
    assert set(ds.element_spec) == {"id", "n_text", "n_text__null", "vm"}
    schema = rowstore.open(path).schema.select(["id", "n_text", "vm"])
    assert sum(_check_rows_batch(el, rows, schema, {}) for el in ds) == N_ROWS


# -- round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize("varlen", ["ragged", "padded"])
def test_roundtrip_batches(data, varlen):
    path, rows = data
    schema = rowstore.open(path).schema
    ds = rtf.make_dataset(path, batch_size=16, shuffle="block", seed=3, varlen=varlen)
    seen = 0
    modes = {f.name: varlen for f in schema}
    for el in ds:
        seen += _check_rows_batch(el, rows, schema, modes)
    assert seen == N_ROWS


def test_roundtrip_varlen_per_field(data):
    path, rows = data
    schema = rowstore.open(path).schema
    modes = {"vm": "padded", "n_var": "padded", "v1": "ragged"}
    ds = rtf.make_dataset(path, batch_size=7, shuffle="full", varlen=modes)
    spec = ds.element_spec
    assert isinstance(spec["vm"], tf.TensorSpec) and "vm__shape" in spec
    assert isinstance(spec["v1"], tf.RaggedTensorSpec) and "v1__shape" not in spec
    assert isinstance(spec["vtail"], tf.RaggedTensorSpec)  # not named: ragged
    assert sum(_check_rows_batch(el, rows, schema, modes) for el in ds) == N_ROWS


def test_padded_extent_is_the_batch_maximum(data):
    path, rows = data
    r = rowstore.open(path)
    ds = rtf.make_dataset(path, batch_size=5, shuffle="none", fields=["id", "vm"], varlen="padded")
    core = r.batches(5, shuffle="none", fields=["id", "vm"], varlen="padded")
    for el, b in zip(ds, core, strict=True):
        np.testing.assert_array_equal(el["vm"].numpy(), b["vm"])  # same as the reader's padding
        np.testing.assert_array_equal(el["vm__shape"].numpy(), b["vm__shape"])


def test_roundtrip_rows(data):
    path, rows = data
    schema = rowstore.open(path).schema
    ds = rtf.make_dataset(path, shuffle="block", seed=1)
    seen = set()
    for el in ds:
        i = int(el["id"].numpy())
        seen.add(i)
        for f in schema:
            got = el[f.name].numpy()
            _assert_same_value(f, got, rows[i][f.name], where=f"field {f.name} row {i}")
            if f.nullable:
                assert bool(el[f.name + "__null"].numpy()) == (rows[i][f.name] is None)
    assert seen == set(range(N_ROWS))


def test_rows_keep_shapes_of_empty_values(data):
    path, rows = data
    ds = rtf.make_dataset(path, shuffle="none", fields=["id", "vm", "vfirst"])
    for el in ds:
        i = int(el["id"].numpy())
        assert tuple(el["vm"].shape) == rows[i]["vm"].shape  # e.g. (0, 3, 2)
        assert tuple(el["vfirst"].shape) == rows[i]["vfirst"].shape  # e.g. (2, 0)


def test_compressed_file(tmp_path):
    path = str(tmp_path / "z.h5")
    schema = Schema([Field("id", "int64"), Field("w", "float32", (None,)), Field("t", STR)])
    with Writer(path, schema, rows_per_block=10, compression="zstd") as w:
        for i in range(57):
            w.write({"id": i, "w": np.full(i % 6, i, np.float32), "t": f"ü{i}"})
    got = {}
    for el in rtf.make_dataset(path, batch_size=8, shuffle="full", seed=2):
        for j, i in enumerate(el["id"].numpy().tolist()):
            got[i] = (el["w"][j].numpy().tolist(), el["t"][j].numpy().decode())
    assert got == {i: ([float(i)] * (i % 6), f"ü{i}") for i in range(57)}


# -- shards, parallel reads, order --------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [None, 32])
@pytest.mark.parametrize("k", [1, 3])
def test_shards_disjoint_and_complete(tiny, batch_size, k):
    count = 3
    parts = []
    for index in range(count):
        ds = rtf.make_dataset(
            tiny, batch_size=batch_size, part=(index, count), num_parallel_reads=k, seed=5
        )
        parts.append(_ids(ds, batched=batch_size is not None))
    flat = [i for p in parts for i in p]
    assert len(flat) == 1000
    assert sorted(flat) == list(range(1000))
    for a in range(count):
        for b in range(a + 1, count):
            assert not set(parts[a]) & set(parts[b])


@pytest.mark.parametrize("k", [2, 4])
def test_parallel_reads_every_row_once(tiny, k):
    ds = rtf.make_dataset(tiny, batch_size=50, num_parallel_reads=k, seed=9, epoch=1)
    ids = _ids(ds)
    assert sorted(ids) == list(range(1000))
    assert int(ds.cardinality()) == sum(1 for _ in ds)
    # deterministic interleave: the same order again
    assert _ids(rtf.make_dataset(tiny, batch_size=50, num_parallel_reads=k, seed=9, epoch=1)) == ids
    # non-deterministic interleave: still every row once
    nd = rtf.make_dataset(tiny, batch_size=50, num_parallel_reads=k, seed=9, deterministic=False)
    assert sorted(_ids(nd)) == list(range(1000))


@pytest.mark.parametrize("shuffle", ["block", "full"])
def test_order_deterministic_by_seed_and_epoch(tiny, shuffle):
    def order(**kw):
        return _ids(rtf.make_dataset(tiny, batch_size=64, shuffle=shuffle, **kw))

    a = order(seed=1, epoch=0)
    assert a == order(seed=1, epoch=0)
    assert sorted(a) == list(range(1000))
    assert a != list(range(1000))
    assert order(seed=1, epoch=1) != a
    assert order(seed=2, epoch=0) != a


def test_order_is_the_readers(tiny):
    # One part, rows: exactly the core reader's epoch order.
    r = rowstore.open(tiny)
    ds = rtf.make_dataset(r, seed=4, epoch=2, part=(1, 2))
    assert _ids(ds, batched=False) == r.epoch_order(seed=4, epoch=2, part=(1, 2)).tolist()
    # Batches (cut from larger chunks inside) keep that order and the batch boundaries.
    core = [b["id"].tolist() for b in r.batches(48, seed=4, epoch=2)]
    got = [el["id"].numpy().tolist() for el in rtf.make_dataset(r, batch_size=48, seed=4, epoch=2)]
    assert got == core


def test_drop_last(tiny):
    ds = rtf.make_dataset(tiny, batch_size=64, drop_last=True, num_parallel_reads=2)
    assert ds.element_spec["x"].shape.as_list() == [64, 16]
    sizes = [int(el["id"].shape[0]) for el in ds]
    assert set(sizes) == {64}
    assert len(sizes) == int(ds.cardinality()) == 2 * (500 // 64)


def test_repeat_epochs(tiny):
    ds = rtf.repeat_epochs(tiny, 3, batch_size=100, seed=7)
    assert int(ds.cardinality()) == 30
    ids = _ids(ds)
    epochs = [ids[e * 1000 : (e + 1) * 1000] for e in range(3)]
    for e, got in enumerate(epochs):
        assert sorted(got) == list(range(1000))
        assert got == _ids(rtf.make_dataset(tiny, batch_size=100, seed=7, epoch=e))
    assert epochs[0] != epochs[1] != epochs[2]
    # Without end: take as many as wanted; later epochs continue in new orders.
    forever = rtf.make_dataset(tiny, batch_size=100, seed=7, num_epochs=None)
    assert int(forever.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    assert _ids(forever.take(30)) == ids


def test_even_shards(tiny):
    sizes = [
        len(
            _ids(
                rtf.make_dataset(tiny, part=(i, 3), even=True, num_parallel_reads=2), batched=False
            )
        )
        for i in range(3)
    ]
    assert sizes == [1000 // 6 * 2] * 3


def test_distribute_dataset_fn(tiny):
    fn = rtf.distribute_dataset_fn(tiny, global_batch_size=40, seed=3, even=False)
    seen = []
    for pid in range(2):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pid, num_replicas_in_sync=2
        )
        ds = fn(ctx)
        assert ds.element_spec["x"].shape.as_list() == [None, 16]
        batches = [el["id"].numpy() for el in ds]
        assert max(len(b) for b in batches) == 20  # per-replica batch size
        seen.append(np.concatenate(batches))
    assert not set(seen[0]) & set(seen[1])
    assert sorted(np.concatenate(seen).tolist()) == list(range(1000))


def test_distribute_datasets_from_function(tiny):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dist = strategy.distribute_datasets_from_function(
        rtf.distribute_dataset_fn(tiny, global_batch_size=100, drop_last=True, seed=1)
    )
    n = 0
    for el in dist:
        n += int(el["x"].shape[0])
    assert n == 1000


# -- arguments --------------------------------------------------------------------------------
def test_bad_arguments(tiny):
    with pytest.raises(ValueError, match="batch_size"):
        rtf.make_dataset(tiny, batch_size=0)
    with pytest.raises(ValueError, match="varlen"):
        rtf.make_dataset(tiny, varlen="dense")
    with pytest.raises(rowstore.SchemaError, match="not selected") as ei:
        rtf.make_dataset(tiny, varlen={"nope": "padded"})
    assert ei.value.field == "nope"
    with pytest.raises(ValueError, match="varlen modes"):
        rtf.make_dataset(tiny, varlen={"x": "nested"})
    with pytest.raises(TypeError, match="varlen"):
        rtf.make_dataset(tiny, varlen=["ragged"])
    with pytest.raises(ValueError, match="part"):
        rtf.make_dataset(tiny, part=(3, 3))
    with pytest.raises(ValueError, match="deal"):  # a dealt shard is not a contiguous part
        rtf.make_dataset(tiny, shard=(0, 3))
    with pytest.raises(ValueError, match="shuffle"):
        rtf.make_dataset(tiny, shuffle="random")
    with pytest.raises(rowstore.SchemaError):
        rtf.make_dataset(tiny, fields=["nope"])
    with pytest.raises(TypeError):
        rtf.make_dataset(12)
    with pytest.raises(TypeError, match="batch_size"):
        rtf.distribute_dataset_fn(tiny, global_batch_size=8, batch_size=4)


@pytest.mark.parametrize(
    "name", ["batch_size", "num_epochs", "num_parallel_reads", "num_threads", "epoch", "seed"]
)
def test_bools_are_not_counts(tiny, name):
    with pytest.raises(ValueError, match=f"^{name} must be a "):
        rtf.make_dataset(tiny, **{name: True})
    with pytest.raises(ValueError, match="^global_batch_size must be a positive int"):
        rtf.distribute_dataset_fn(tiny, global_batch_size=True)


def test_import_rowstore_does_not_import_tensorflow():
    code = "import sys, rowstore, rowstore.reader; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- batches of fixed-shape fields: chunks handed to tf.data as stacks of batches -----------------
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_fixed_fields_batches_are_the_readers(data, drop_last, k):
    # No variable field (strings, bytes, nulls, images and every dtype are there): each chunk
    # is reshaped to (n, batch, ...) and unbatched in tf.data; the values, the signature and
    # the batch boundaries must be those of Reader.batches over the same rows.
    path, rows = data
    r = rowstore.open(path)
    names = [f.name for f in r.schema if not f.is_variable]
    schema = r.schema.select(names)
    ds = rtf.make_dataset(
        path, batch_size=16, fields=names, seed=3, drop_last=drop_last, num_parallel_reads=k
    )
    assert ds.element_spec == rtf.output_signature(
        schema, batch_size=16, drop_last=drop_last, fields=names
    )
    els = list(ds)
    assert len(els) == int(ds.cardinality())
    seen = sum(_check_rows_batch(el, rows, schema, {}) for el in els)
    parts = [(i, k) for i in range(k)]
    want = [
        b["id"].tolist()
        for p in parts
        for b in r.batches(16, seed=3, part=p, fields=names, drop_last=drop_last)
    ]
    got = [el["id"].numpy().tolist() for el in els]
    if k == 1:
        assert got == want
    else:  # parts interleaved batch by batch: the same batches
        assert sorted(got) == sorted(want)
    assert seen == sum(len(b) for b in want) == (N_ROWS if not drop_last else seen)
    if drop_last:
        assert {len(b) for b in got} == {16}


def test_stack_batches_carries_rows_across_chunks():
    # Chunks whose lengths are not multiples of the batch size: batch boundaries are those
    # of the concatenated stream, text included.
    from rowstore.tf._dataset import _stack_batches

    lengths = [10, 7, 9, 3]
    ids = np.arange(sum(lengths))
    text = np.array([f"t{i}" for i in ids], dtype=object)
    chunks, a = [], 0
    for n in lengths:
        part = ids[a : a + n]
        chunks.append({"id": part, "t": text[a : a + n], "x": np.stack([part, part], 1)})
        a += n
    for drop_last in (False, True):
        got = []
        for stack in _stack_batches(iter(chunks), 4, drop_last):
            assert stack["x"].shape == stack["id"].shape + (2,)
            for j in range(len(stack["id"])):
                assert stack["t"][j].tolist() == [f"t{i}" for i in stack["id"][j]]
                got.append(stack["id"][j].tolist())
        want = [ids[i : i + 4].tolist() for i in range(0, len(ids), 4)]
        if drop_last:
            want = [b for b in want if len(b) == 4]
        assert got == want
