"""Third-party codecs end to end: the documented registration paths (``register_codec`` and the
``rowstore.codecs`` entry-point group), on a ``str`` field, on array fields (heap payloads of
fixed and variable shape, and fixed-size values stored in the row), through the writer, the
reader (take, batches, every read path), torch and tf."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

import rowstore
from rowstore import Codec, Field, Schema, register_codec
from rowstore.errors import CodecError, FormatError


@register_codec
class ZlibText(Codec):
    """Text stored zlib-compressed: a heap codec on a ``str`` field (the reader used to decode
    any str field's bytes as UTF-8, whatever its codec)."""

    codec_id = "test-zlib-text"

    def check_field(self, field):
        if field.dtype != "str":
            raise rowstore.SchemaError(f"{self.codec_id} stores str", field=field.name)

    def encode(self, value, field):
        return zlib.compress(value.encode("utf-8"))

    def decode_into(self, src, out):
        try:
            out[()] = zlib.decompress(src.tobytes()).decode("utf-8")
        except zlib.error as exc:
            raise CodecError(f"not a zlib stream: {exc}", codec=self.codec_id) from exc


@register_codec
class ZlibArray(Codec):
    """Numbers stored zlib-compressed in the heap (fixed or variable shape); releases the GIL
    (zlib does), so the reader decodes on its pool."""

    codec_id = "test-zlib-array"
    releases_gil = True

    def check_field(self, field):
        if field.dtype in ("str", "bytes"):
            raise rowstore.SchemaError(f"{self.codec_id} stores numbers", field=field.name)

    def encode(self, value, field):
        return zlib.compress(np.ascontiguousarray(value).tobytes())

    def decode_into(self, src, out):
        raw = zlib.decompress(src.tobytes())
        if len(raw) != out.nbytes:
            raise CodecError(
                f"{len(raw)} bytes decoded, {out.nbytes} expected", codec=self.codec_id
            )
        out[...] = np.frombuffer(raw, out.dtype).reshape(out.shape)


@register_codec
class Half(Codec):
    """float32 values stored as float16 inside the row: a fixed-size codec that is not raw."""

    codec_id = "test-half"

    def stored_nbytes(self, field):
        return field.fixed_nbytes // 2

    def check_field(self, field):
        if field.dtype != np.float32 or field.is_variable:
            raise rowstore.SchemaError(
                f"{self.codec_id} stores fixed-shape float32", field=field.name
            )

    def check_value(self, value, field):
        if np.abs(value).max(initial=0) > 65504:
            raise CodecError(
                f"field {field.name!r}: values beyond float16's range",
                codec=self.codec_id,
                field=field.name,
            )

    def encode(self, value, field):
        return np.ascontiguousarray(value, np.float16).tobytes()

    def decode_into(self, src, out):
        out[...] = np.frombuffer(src, np.float16).reshape(out.shape)


SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("text", "str", codec="test-zlib-text", nullable=True),
        Field("grid", "int32", (4, 3), codec="test-zlib-array"),
        Field("wave", "float32", (None,), codec="test-zlib-array", nullable=True),
        Field("half", "float32", (5,), codec="test-half", nullable=True),
    ]
)
N = 300


def _row(i: int) -> dict:
    return {
        "id": i,
        "text": None if i % 7 == 3 else f"clip {i}: " + "ünïcode " * (i % 5),
        "grid": np.arange(12, dtype=np.int32).reshape(4, 3) * i,
        "wave": None if i % 11 == 5 else np.linspace(0, 1, i % 37, dtype=np.float32),
        "half": None if i % 13 == 2 else np.full(5, i / 8, np.float32),
    }


@pytest.fixture(scope="module", params=[None, "lz4"])
def plugin_file(tmp_path_factory, request):
    path = str(tmp_path_factory.mktemp("plugins") / f"p-{request.param}.h5")
    with rowstore.Writer(path, SCHEMA, compression=request.param, block_bytes=4096) as w:
        for i in range(N):
            w.write(_row(i))
    return path


def _check(i: int, got: dict) -> None:
    exp = _row(i)
    assert got["text"] == exp["text"]
    np.testing.assert_array_equal(got["grid"], exp["grid"])
    if exp["wave"] is None:
        assert got["wave"] is None or len(got["wave"]) == 0
    else:
        np.testing.assert_array_equal(got["wave"], exp["wave"])
    if exp["half"] is not None:
        np.testing.assert_array_equal(got["half"], exp["half"])  # i/8 is exact in float16


def test_stored_placement_is_the_codecs():
    assert not SCHEMA["text"].inline and not SCHEMA["grid"].inline and not SCHEMA["wave"].inline
    assert SCHEMA["half"].inline and SCHEMA["half"].stored_nbytes == 10
    assert rowstore.format.spec.row_dtype(SCHEMA)["half"].itemsize == 10


def test_rows_round_trip(plugin_file):
    with rowstore.open(plugin_file) as r:
        for i in (0, 1, 3, 5, 13, 150, N - 1):
            _check(i, r[i])


@pytest.mark.parametrize("verify", [True, "always"])
def test_take_and_batches_round_trip(plugin_file, verify):
    with rowstore.open(plugin_file, verify=verify, num_threads=2) as r:
        idx = np.random.default_rng(0).permutation(N)[:120]
        b = r.take(idx)
        for j, i in enumerate(idx):
            _check(
                int(i),
                {
                    k: (None if r.schema[k].nullable and b[k + "__null"][j] else b[k][j])
                    for k in SCHEMA.names
                },
            )
        for shuffle in ("block", "full", "none"):
            seen = []
            for batch in r.batches(32, shuffle=shuffle, seed=2, num_threads=2):
                for j, i in enumerate(batch["id"]):
                    row = {
                        k: (
                            None if r.schema[k].nullable and batch[k + "__null"][j] else batch[k][j]
                        )
                        for k in SCHEMA.names
                    }
                    _check(int(i), row)
                seen.extend(batch["id"].tolist())
            assert sorted(seen) == list(range(N))


def test_out_arrays_for_decoded_fields(plugin_file):
    with rowstore.open(plugin_file) as r:
        out = {"grid": np.empty((3, 4, 3), np.int32), "half": np.empty((3, 5), np.float32)}
        b = r.take([4, 5, 6], fields=["grid", "half"], out=out)
        assert b["grid"] is out["grid"] and b["half"] is out["half"]
        np.testing.assert_array_equal(out["grid"][1], _row(5)["grid"])


def test_torch_round_trip(plugin_file):
    rst = pytest.importorskip("rowstore.torch")
    with rst.BatchedDataLoader(
        plugin_file,
        batch_size=50,
        shuffle="block",
        seed=1,
        varlen="padded",
        fields=["id", "text", "grid", "wave", "half"],
    ) as loader:
        n = 0
        for batch in loader:
            for j, i in enumerate(batch["id"].tolist()):
                exp = _row(i)
                assert batch["text"][j] == exp["text"]
                assert batch["grid"][j].numpy().tolist() == exp["grid"].tolist()
                k = int(batch["wave__shape"][j, 0])
                np.testing.assert_array_equal(
                    batch["wave"][j, :k].numpy(), exp["wave"] if exp["wave"] is not None else []
                )
                n += 1
        assert n == N


def test_tf_round_trip(plugin_file):
    rtf = pytest.importorskip("rowstore.tf")
    n = 0
    for el in rtf.make_dataset(plugin_file, batch_size=64, shuffle="none"):
        for j, i in enumerate(el["id"].numpy().tolist()):
            exp = _row(i)
            text = el["text"][j].numpy().decode("utf-8")
            assert text == (exp["text"] or "")
            assert el["grid"][j].numpy().tolist() == exp["grid"].tolist()
            np.testing.assert_array_equal(
                el["wave"][j].numpy(), exp["wave"] if exp["wave"] is not None else []
            )
            n += 1
    assert n == N


def test_undecodable_payload_names_field_and_row(tmp_path):
    """A payload the codec rejects is a FormatError with path, field and row, not garbage."""
    path = str(tmp_path / "bad.h5")
    schema = Schema([Field("id", "int64"), Field("text", "str", codec="test-zlib-text")])
    with rowstore.Writer(path, schema) as w:
        for i in range(20):
            w.write({"id": i, "text": f"row {i}"})
    with rowstore.open(path) as r:
        layout = r.layout
    # Flip the zlib header of row 7's payload in the (uncompressed) heap; fix up the CRC so
    # only the codec can notice.
    import h5py

    with h5py.File(path, "r") as f:
        heap = f["rowstore/heap"]
        rows = f["rowstore/rows"][()]
        off = int(rows["text"]["offset"][7])
        chunk = heap.id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(chunk.byte_offset + off)
        fh.write(b"\x00\x00")
        fh.seek(chunk.byte_offset)
        data = fh.read(chunk.size)
    crc = zlib.crc32(data)
    with h5py.File(path, "r+") as f:
        hc = f["rowstore/heap_chunks"][()]
        hc["checksum"][0] = crc
        f["rowstore/heap_chunks"][...] = hc
    del layout
    with rowstore.open(path, allow_missing_footer=True) as r:  # h5py cut the footer at close
        assert r[6]["text"] == "row 6"
        with pytest.raises(FormatError) as ei:
            r.take(np.arange(20))
    assert ei.value.field == "text" and ei.value.row == 7 and ei.value.path == path
    assert "row 7" in str(ei.value)


def test_entry_point_registration(plugin_file, tmp_path):
    """A codec installed under the ``rowstore.codecs`` entry-point group is found when a file
    names it, in a process that never registered it by hand."""
    site = tmp_path / "site"
    (site / "rs_plugin_test-1.0.dist-info").mkdir(parents=True)
    (site / "rs_plugin_test-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rs-plugin-test\nVersion: 1.0\n"
    )
    (site / "rs_plugin_test-1.0.dist-info" / "entry_points.txt").write_text(
        "[rowstore.codecs]\ntest-zlib-text = rs_plugin_test:ZlibText\ntest-zlib-array = "
        "rs_plugin_test:ZlibArray\n"
        "test-half = rs_plugin_test:Half\n"
    )
    src = open(__file__).read()
    classes = src[src.index("@register_codec\nclass ZlibText") : src.index("SCHEMA = ")].replace(
        "@register_codec\n", ""
    )
    (site / "rs_plugin_test.py").write_text(
        "import zlib\nimport numpy as np\nimport rowstore\nfrom rowstore import Codec\nfrom "
        "rowstore.errors import CodecError\n" + classes
    )
    code = textwrap.dedent(f"""
        import rowstore
        from rowstore.codecs import registered_codecs
        with rowstore.open({plugin_file!r}) as r:
            print(r[4]["text"], int(r[4]["grid"].sum()),
            type(r.schema["text"].codec_obj).__module__)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.getcwd()]))
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [
        "clip",
        "4:",
        *(["ünïcode"] * 4),
        str(int(_row(4)["grid"].sum())),
        "rs_plugin_test",
    ]


def test_write_batch_checks_each_value_of_an_in_row_codec(tmp_path):
    """A column given as one ndarray skips per-value work for raw fields only: an in-row codec's
    own check (here: float16 range) still runs on every value, and the batch is refused whole."""
    schema = Schema([Field("id", "int64"), Field("half", "float32", (5,), codec="test-half")])
    path = str(tmp_path / "h.h5")
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"id": np.arange(3), "half": np.ones((3, 5), np.float32)})
        bad = np.ones((4, 5), np.float32)
        bad[2, 1] = 1e6
        with pytest.raises(rowstore.RowValidationError) as ei:
            w.write_batch({"id": np.arange(3, 7), "half": bad})
        assert ei.value.field == "half" and ei.value.row == 5
    with rowstore.open(path) as r:
        assert len(r) == 3 and r.take([2])["half"].tolist() == [[1.0] * 5]
