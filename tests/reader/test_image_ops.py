"""Decode-time image ops (``decode={"image": RandomResizedCrop(224)}``) through the reader, the
torch loaders and rowstore.tf: fixed-size batches from variable-size JPEGs, each row's image the
kernel's for the key of (seed, epoch, field, dataset row), so the same in every entry point, on
every world size and after a resume; the fallback decoder (no kernel) gives the same geometry;
a damaged stored JPEG is a FormatError naming field and row; declarations are checked."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore.errors import FormatError, SchemaError
from rowstore.reader import _decode
from rowstore.reader import image_ops as io
from rowstore.schema import Field, Schema

imagecodecs = pytest.importorskip("imagecodecs")

N = 45
RRC = io.RandomResizedCrop(32)


def photo(rng, h, w, c):
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([128 + 90 * np.sin(x / 17 + k) * np.cos(y / 11 - k) for k in range(c)], -1)
    a = np.clip(a + rng.normal(0, 5, a.shape), 0, 255).astype(np.uint8)
    return a if c == 3 else np.ascontiguousarray(a[..., 0])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A file of N rows: a variable-size RGB jpeg, a variable-size grayscale jpeg (nullable),
    a label; and the images written."""
    path = str(tmp_path_factory.mktemp("images") / "images.h5")
    schema = Schema(
        [
            Field("image", "uint8", (None, None, 3), codec="jpeg"),
            Field("gray", "uint8", (None, None), codec="jpeg", nullable=True),
            Field("label", "int64"),
        ]
    )
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N):
        h, w = (int(v) for v in rng.integers(40, 160, 2))
        gray = None if i % 7 == 3 else photo(rng, w, h, 1)
        rows.append({"image": photo(rng, h, w, 3), "gray": gray, "label": i})
    with rowstore.Writer(path, schema, rows_per_block=8) as wr:
        for r in rows:
            wr.write(r)
    return path, rows


@pytest.fixture
def reader(images):
    """A reader of the images, closed (its decode threads stopped) after the test; the loaders
    are given it, so they never own one."""
    r = rowstore.open(images[0])
    yield r
    r.close()


def expected(rows, field, op, seed, epoch, row, channels):
    """What row ``row`` of ``field`` decodes to under ``op`` in (seed, epoch): the reference
    decode of its JPEG (the codec's encoding is deterministic) with its key."""
    payload = imagecodecs.jpeg8_encode(rows[row][field], level=90)
    key = io.row_key(io.image_base(seed, epoch, field), row)
    img, params = io.decode_reference(op, payload, key, channels)
    return img.reshape(op.size + ((3,) if channels == 3 else ())), params


def test_batches_are_fixed_size_and_each_row_is_its_key(images, reader):
    _, rows = images
    r = reader
    decode = {"image": RRC, "gray": io.CenterCrop((20, 24), fraction=0.9)}
    got = list(r.deal(10, shuffle="full", seed=4, epoch=2, with_ids=True, decode=decode))
    assert [b["image"].shape for b in got] == [(10, 32, 32, 3)] * 4 + [(5, 32, 32, 3)]
    assert all(b["gray"].shape[1:] == (20, 24) and b["gray"].dtype == np.uint8 for b in got)
    ids = np.concatenate([b["__id"] for b in got])
    assert sorted(ids) == list(range(N))
    image = np.concatenate([b["image"] for b in got])
    gray = np.concatenate([b["gray"] for b in got])
    nulls = np.concatenate([b["gray__null"] for b in got])
    assert np.array_equal(got[0]["label"], [rows[i]["label"] for i in ids[:10]])
    for k, row in enumerate(ids):
        want, _ = expected(rows, "image", RRC, 4, 2, int(row), 3)
        d = np.abs(want.astype(int) - image[k])
        assert d.mean() < 1.5 and d.max() <= 24
        if rows[row]["gray"] is None:
            assert nulls[k] and not gray[k].any()
        else:
            want, _ = expected(rows, "gray", decode["gray"], 4, 2, int(row), 1)
            assert np.abs(want.astype(int) - gray[k]).mean() < 1.5
    assert r.output_schema(decode=decode)["image"].shape == (32, 32, 3)
    assert r.output_schema(decode=decode)["gray"].shape == (20, 24)


def by_row(batches):
    out = {}
    for b in batches:
        for i, row in enumerate(b["__id"]):
            out[int(row)] = b["image"][i]
    return out


def test_images_depend_on_seed_epoch_and_row_only(reader):
    r = reader
    d = {"image": RRC}
    e0 = by_row(r.deal(8, shuffle="full", seed=1, epoch=0, with_ids=True, decode=d))
    again = by_row(r.deal(8, shuffle="block", seed=1, epoch=0, with_ids=True, decode=d))
    e1 = by_row(r.deal(8, shuffle="full", seed=1, epoch=1, with_ids=True, decode=d))
    s2 = by_row(r.deal(8, shuffle="full", seed=2, epoch=0, with_ids=True, decode=d))
    assert all(np.array_equal(e0[k], again[k]) for k in e0)  # the order does not matter
    assert sum(np.array_equal(e0[k], e1[k]) for k in e0) < 3  # a new epoch, new crops
    assert sum(np.array_equal(e0[k], s2[k]) for k in e0) < 3
    # elastic: two consumers of a dealt epoch decode each row as one consumer does
    parts = {}
    for rank in range(3):
        parts.update(
            by_row(
                r.deal(4, shuffle="full", seed=1, epoch=0, shard=(rank, 3), with_ids=True, decode=d)
            )
        )
    assert sorted(parts) == sorted(e0) and all(np.array_equal(e0[k], parts[k]) for k in e0)
    # Reader.batches (a contiguous part) too
    b = list(r.batches(N, shuffle="none", seed=1, epoch=0, decode=d))[0]["image"]
    assert all(np.array_equal(b[k], e0[k]) for k in range(N))


def test_the_fallback_decoder_gives_the_same_geometry(reader, monkeypatch):
    r = reader
    d = {"image": io.RandomResizedCrop((24, 40)), "gray": io.Resize(16)}
    fast = list(r.batches(N, shuffle="none", seed=3, decode=d))[0]
    monkeypatch.setattr(_decode, "JPEG_KERNEL", False)
    slow = list(r.batches(N, shuffle="none", seed=3, decode=d))[0]
    for name in d:
        assert fast[name].shape == slow[name].shape
        diff = np.abs(fast[name].astype(int) - slow[name])
        assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 8
    assert np.array_equal(fast["gray__null"], slow["gray__null"])


def test_torch_loader_resumes_exactly(reader):
    torch = pytest.importorskip("torch")
    from rowstore.torch import BatchedDataLoader, IterableDataset

    path = reader
    kw = dict(batch_size=8, seed=5, shuffle="full", decode={"image": RRC}, fields=["image"])
    whole = [b["image"] for b in BatchedDataLoader(path, **kw)]
    assert whole[0].shape == (8, 32, 32, 3) and whole[0].dtype == torch.uint8
    dl = BatchedDataLoader(path, **kw)
    it = iter(dl)
    head = [next(it)["image"] for _ in range(2)]
    state = dl.state_dict()
    it.close()
    resumed = BatchedDataLoader(path, **kw)
    resumed.load_state_dict(state)
    rest = [b["image"] for b in resumed]
    assert len(head) + len(rest) == len(whole)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, whole))
    # the iterable dataset (DataLoader workers) decodes the same batches
    ds = IterableDataset(path, **kw)
    got = [b["image"] for b in ds]
    assert all(torch.equal(a, b) for a, b in zip(got, whole))


def test_tf_loader_gives_the_same_images(reader):
    pytest.importorskip("tensorflow")
    import rowstore.tf as rtf
    from rowstore.torch import BatchedDataLoader

    path = reader
    kw = dict(batch_size=8, seed=5, shuffle="full", decode={"image": RRC}, fields=["image"])
    want = [b["image"].numpy() for b in BatchedDataLoader(path, **kw)]
    loader = rtf.Loader(path, **kw)
    got = [b["image"].numpy() for b in loader.dataset()]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert loader.dataset().element_spec["image"].shape.as_list()[1:] == [32, 32, 3]
    ds = rtf.make_dataset(path, batch_size=8, seed=5, shuffle="none", decode={"image": RRC})
    first = next(iter(ds))["image"].numpy()
    assert first.shape == (8, 32, 32, 3)


def test_a_damaged_stored_jpeg_names_field_and_row(tmp_path):
    path = str(tmp_path / "bad.h5")
    schema = Schema([Field("image", "uint8", (None, None, 3), codec="jpeg")])
    rng = np.random.default_rng(1)
    imgs = [photo(rng, 48, 64, 3) for _ in range(6)]
    with rowstore.Writer(path, schema, rows_per_block=4) as wr:
        for a in imgs:
            wr.write({"image": a})
    payload = imagecodecs.jpeg8_encode(imgs[4], level=90)
    blob = bytearray(open(path, "rb").read())
    tail = payload[-300:]  # the headers of same-size images are alike; the scans differ
    at = blob.find(tail) - (len(payload) - 300)
    assert at > 0 and blob[at : at + len(payload)] == payload  # the heap holds it as written
    sof = at + payload.find(b"\xff\xc0")
    blob[sof + 5 : sof + 9] = b"\x00" * 4  # a frame of 0 x 0 pixels: every decode sees it
    open(path, "wb").write(bytes(blob))
    with rowstore.open(path, verify=False) as r, pytest.raises(FormatError, match="row 4") as e:
        list(r.batches(6, shuffle="none", decode={"image": io.Resize(8)}))
    assert e.value.field == "image" and e.value.row == 4
    assert isinstance(e.value, rowstore.RowstoreError)


def test_declarations_are_checked_against_the_schema(reader):
    r = reader
    with pytest.raises(SchemaError, match="label"):
        list(r.batches(8, decode={"label": RRC}))
    with pytest.raises(SchemaError, match="nope"):
        list(r.batches(8, decode={"nope": RRC}))
    with pytest.raises(SchemaError, match="not among the fields read"):
        list(r.batches(8, fields=["label"], decode={"image": RRC}))
    with pytest.raises(TypeError):
        list(r.batches(8, decode={"image": (224, 224)}))
    assert rowstore.RandomResizedCrop is io.RandomResizedCrop


def test_entry_points_without_ops_refuse_them(images):
    path, _ = images
    m = rowstore.mix({path: 1.0}, seed=0)
    try:
        with pytest.raises(ValueError, match="does not apply decode"):
            list(m.deal(8, decode={"image": RRC}))
        with pytest.raises(ValueError, match="does not apply decode"):
            list(m.batches(8, decode={"image": RRC}))
    finally:
        m.close()


def test_the_kernel_gets_plain_numbers_from_an_op():
    """The reader hands the JPEG kernel numbers (``ImageOp.kernel_args``), never the op."""
    import math

    for op in (io.Resize(8), io.CenterCrop(8, fraction=0.5), RRC, io.Resize(4, flip=True)):
        args = op.kernel_args()
        flat = [v for a in args.values() for v in (a if isinstance(a, tuple) else (a,))]
        assert isinstance(args["mode"], str) and all(isinstance(v, (str, float)) for v in flat), (
            args
        )
    assert io.CenterCrop(8, fraction=0.5).kernel_args()["fraction"] == 0.5
    assert RRC.kernel_args()["log_ratio"] == (math.log(3 / 4), math.log(4 / 3))
    assert RRC.kernel_args()["scale"] == (0.08, 1.0) and RRC.kernel_args()["flip"] == 0.5
