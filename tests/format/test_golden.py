"""The golden files: one per format version, written once by ``tests/data/make_golden_*.py``,
committed, never regenerated (tests/data/README.md). Every run reads each of them and compares it
with its JSON exactly.

The cases, in ``GOLDEN``:

- ``v1``: format v1 (Blosc2/lz4, every kind of field; the JSON holds the layout and every value);
- ``v2``: v1's rows as format v2 (the checksummed footer after the HDF5 file);
- ``v3``: v1's rows as format v3, uncompressed, with the page index;
- ``v3_lz4``: format v3 compressed, with memcpy'd heap chunks (its own rows: ids, blobs, text);
- ``dataset_v1``: a dataset directory of manifest format v1 (four v1 shards, two versions).

Checks every golden gets come first (committed and unchanged, ``rowstore verify``, a make
script that refuses to overwrite), then those of every file (index, footer, page index, the HDF5
part), then the ones scoped to one version's content.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import DATA, memcpyed_starts

import rowstore
from rowstore import ChecksumError, FormatError, FormatVersionError, Layout, Schema
from rowstore.cli import main as cli_main
from rowstore.format import footer, manifest, spec


@dataclass(frozen=True)
class Golden:
    """One golden: its file (or directory), its JSON and the script that made both."""

    name: str
    path: str
    json: str
    script: str
    #: files git must hold under ``path`` (a directory's shards, manifests, sidecars, pointer)
    git_files: int = 1

    def __str__(self) -> str:
        return self.name


def _golden(name: str, stem: str, git_files: int = 1) -> Golden:
    return Golden(
        name,
        os.path.join(DATA, stem + ("" if git_files > 1 else ".h5")),
        os.path.join(DATA, stem + ".json"),
        os.path.join(DATA, "make_" + stem + ".py"),
        git_files,
    )


GOLDEN = {
    "v1": _golden("v1", "golden_v1"),
    "v2": _golden("v2", "golden_v2"),
    "v3": _golden("v3", "golden_v3"),
    "v3_lz4": _golden("v3_lz4", "golden_v3_lz4"),
    # pointer, 2 manifests, 2 sidecars, 4 shards
    "dataset_v1": _golden("dataset_v1", "golden_dataset_v1", git_files=9),
}


def cases(*names: str) -> pytest.MarkDecorator:
    """Parametrize ``g`` over the named goldens."""
    return pytest.mark.parametrize("g", [GOLDEN[n] for n in names], ids=list(names))


EVERY = cases(*GOLDEN)
FILES = cases("v1", "v2", "v3", "v3_lz4")
#: the files holding v1's rows (golden_v1.json has their schema, attributes and values)
V1_ROWS = cases("v1", "v2", "v3")
#: the files ending in rowstore's footer
FOOTERED = cases("v2", "v3", "v3_lz4")
#: the files with a page index
PAGED = cases("v3", "v3_lz4")


@functools.cache
def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def expected(g: Golden) -> dict:
    """What ``g`` must read as (a fresh copy of its JSON)."""
    return json.loads(json.dumps(_load(g.json)))


V1 = GOLDEN["v1"]


def decode_value(field, obj):
    if obj is None:
        return None
    if field.dtype == "str":
        return obj
    if field.dtype == "bytes":
        return base64.b64decode(obj["b64"])
    assert np.dtype(obj["dtype"]) == field.dtype
    return np.frombuffer(base64.b64decode(obj["b64"]), dtype=obj["dtype"]).reshape(obj["shape"])


def expected_rows(exp, schema):
    return [{f.name: decode_value(f, row[f.name]) for f in schema} for row in exp["rows"]]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --- every golden ------------------------------------------------------------------------------


def assert_unchanged_in_git(*paths: str) -> None:
    """Golden files are never regenerated: git must know them, unmodified (skips outside a
    checkout)."""
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            capture_output=True,
            text=True,
            cwd=DATA,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("git not available")
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    assert proc.stdout.strip() == "", f"golden files modified or untracked:\n{proc.stdout}"


@EVERY
def test_files_are_committed_and_unchanged(g):
    """Git holds the golden and its JSON, unmodified; the JSON says what made them."""
    assert_unchanged_in_git(g.path, g.json)
    listed = subprocess.run(
        ["git", "ls-files", "--", g.path, g.json], capture_output=True, text=True, cwd=DATA
    ).stdout.split()
    assert len(listed) == g.git_files + 1, listed
    assert expected(g)["made_with"]["rowstore"] == "0.1.0"


@EVERY
def test_verify_cli(g, capsys):
    assert cli_main(["verify", g.path]) == 0
    assert "OK" in capsys.readouterr().out


def _run_script(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, path], capture_output=True, text=True, timeout=120, cwd=DATA
    )


def _digests(root: str) -> dict[str, str]:
    if os.path.isfile(root):
        return {root: sha256(root)}
    return {
        os.path.join(d, n): sha256(os.path.join(d, n)) for d, _, ns in os.walk(root) for n in ns
    }


@EVERY
def test_make_script_refuses_to_overwrite(g, tmp_path):
    """Run in a copy of tests/data's golden (and of the v1 script the others import), the make
    script refuses, changing nothing."""
    for path in {g.script, V1.script}:
        shutil.copy(path, tmp_path)
    made = [str(tmp_path / os.path.basename(p)) for p in (g.path, g.json)]
    for src, dst in zip((g.path, g.json), made):
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
    before = {k: v for p in made for k, v in _digests(p).items()}
    proc = _run_script(str(tmp_path / os.path.basename(g.script)))
    assert proc.returncode == 1 and "refusing to overwrite" in proc.stderr
    assert {k: v for p in made for k, v in _digests(p).items()} == before


# --- every golden file: index, footer, page index, the HDF5 part -------------------------------


def _index_json(g: Golden) -> dict:
    """The part of ``g``'s JSON holding its block and heap-chunk indexes."""
    exp = expected(g)
    return exp["layout"] if g is V1 else exp


@FILES
def test_index_is_the_json(g):
    L = Layout.open(g.path, scan=True)
    assert L.version == expected(g)["format_version"]
    assert L.blocks.dtype == spec.BLOCK_DTYPE and L.heap_chunks.dtype == spec.HEAP_CHUNK_DTYPE
    exp = _index_json(g)
    for name in spec.BLOCK_DTYPE.names:
        assert L.blocks[name].tolist() == exp["blocks"][name], name
    for name in spec.HEAP_CHUNK_DTYPE.names:
        assert L.heap_chunks[name].tolist() == exp["heap_chunks"][name], name
    if "compression" in exp:
        assert L.compression == exp["compression"] and L.compression["cname"] == "lz4"


@FOOTERED
def test_footer_bytes_are_the_json(g):
    L = Layout.open(g.path, scan=True)
    exp = expected(g)
    assert L.footer_offset == exp["footer_offset"]
    assert L.file_size == exp["file_size"] == os.path.getsize(g.path)
    with open(g.path, "rb") as f:
        f.seek(L.footer_offset)
        tail = f.read()
    assert len(tail) == exp["footer_and_trailer_bytes"]
    assert hashlib.sha256(tail).hexdigest() == exp["footer_and_trailer_sha256"]
    assert tail.startswith(footer.FOOTER_MAGIC)
    assert tail[-footer.TRAILER_SIZE :].startswith(footer.TRAILER_MAGIC)
    if L.version >= 3:
        assert footer.PAGE_MAGIC in tail


def _h5_raw(g: Golden, what: str, size: int) -> bytes:
    """Dataset ``what`` of ``g`` as h5py's Blosc2 filter decodes it, zero-padded to ``size``."""
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401

    with h5py.File(g.path, "r") as f:
        data = f["rowstore"][what][()].tobytes()
    return data + bytes(-len(data) % size)


@PAGED
def test_page_index_is_the_crc32_of_each_page(g):
    """Each page CRC is zlib.crc32 of a page of the chunk's raw bytes (docs/format.md, the page
    index): the stored bytes of an uncompressed file, h5py's decode (not rowstore's) of a
    compressed one."""
    L = Layout.open(g.path, scan=True)
    exp = expected(g)
    assert L.version == 3 and L.page_bytes == exp["page_bytes"] == 4096
    assert L.block_pages.tolist() == exp["block_pages"]
    assert L.heap_pages.tolist() == exp["heap_pages"]
    if L.compression is None:
        with open(g.path, "rb") as f:
            raw = f.read()
        rs = L.row_dtype.itemsize
        plen = max(1, 4096 // rs) * rs
        pages = []
        for b in L.blocks:
            at, size = int(b["offset"]), L.rows_per_block * rs
            pages += [
                zlib.crc32(raw[at + a : at + min(a + plen, size)]) for a in range(0, size, plen)
            ]
        assert pages == exp["block_pages"]
        hpages = []
        for c in L.heap_chunks:
            at, size = int(c["offset"]), L.heap_chunk_bytes
            hpages += [
                zlib.crc32(raw[at + a : at + min(a + 4096, size)]) for a in range(0, size, 4096)
            ]
        assert hpages == exp["heap_pages"]
        return
    for what, ds, pages in (("block", "rows", L.block_pages), ("heap chunk", "heap", L.heap_pages)):
        plen, per = L.page_geometry(what)
        size = L.block_raw_bytes if what == "block" else L.heap_chunk_bytes
        raw = _h5_raw(g, ds, size)
        want = [
            zlib.crc32(raw[c * size + j * plen : c * size + min((j + 1) * plen, size)])
            for c in range(len(raw) // size)
            for j in range(per)
        ]
        assert pages.tolist() == want, what


@PAGED
def test_a_reader_of_v1_and_v2_refuses_v3_by_its_version(g, monkeypatch):
    """What a reader from before v3 does with the file: its version check comes before its
    index is looked at, so it raises FormatVersionError (never a misread index)."""
    monkeypatch.setattr(spec, "READABLE_VERSIONS", (1, 2))
    with pytest.raises(FormatVersionError, match="v3"):
        Layout.open(g.path)


@cases("v2", "v3")
def test_hdf5_part_is_the_same_file(g, tmp_path):
    """h5py sees the same index; with the footer cut off, the v1 path reads the same values
    (without the page index: a reader then checks whole chunks, as for v1 and v2)."""
    h5py = pytest.importorskip("h5py")
    L = Layout.open(g.path)
    with h5py.File(g.path, "r") as f:
        assert np.array_equal(f["rowstore/blocks"][()], L.blocks)
        assert int(f["rowstore"].attrs["format_version"]) == L.version
    cut = str(tmp_path / "cut.h5")
    shutil.copyfile(g.path, cut)
    footer.cut(cut, L.footer_offset)
    with pytest.raises(FormatError, match="footer is gone"):  # its attributes say it had one
        Layout.open(cut)
    Lc = Layout.open(cut, allow_missing_footer=True)
    assert Lc.footer_offset == 0 and Lc.page_bytes == 0 and Lc.block_pages is None
    check_v1_rows(cut, allow_missing_footer=True)


# --- the files holding v1's rows: v1, v2, v3 ---------------------------------------------------


V1_NAMES = ["id", "score", "vec", "mat", "flag", "maybe", "label", "note", "wave", "grid"]
V1_NAMES += ["pairs", "image"]


@V1_ROWS
def test_schema_and_attributes(g):
    layout = Layout.open(g.path)
    v1 = expected(V1)
    assert layout.version == expected(g)["format_version"] == int(g.name[1])
    assert layout.schema == Schema.from_json(v1["schema"])
    assert layout.schema.to_json() == v1["schema"]
    assert layout.user_attrs == v1["user_attrs"]
    assert layout.schema.names == V1_NAMES
    kinds = {f.name: ("inline" if f.inline else "heap") for f in layout.schema}
    assert [n for n, k in kinds.items() if k == "inline"] == V1_NAMES[:6]


def check_v1_rows(path: str, **open_kwargs) -> None:
    """Every value of every row of ``path``, by ``r[i]``, is golden_v1.json's: same type, dtype,
    shape and bytes; nulls null."""
    with rowstore.open(path, **open_kwargs) as r:
        schema = r.schema
        rows = expected_rows(expected(V1), schema)
        assert len(r) == len(rows) == 36
        for i, want in enumerate(rows):
            got = r[i]
            assert set(got) == set(schema.names)
            for f in schema:
                exp, val = want[f.name], got[f.name]
                if exp is None:
                    assert val is None, (i, f.name)
                elif f.dtype in ("str", "bytes"):
                    assert type(val) is type(exp) and val == exp, (i, f.name)
                else:
                    val = np.asarray(val)
                    assert val.dtype == f.dtype and val.shape == exp.shape, (
                        i,
                        f.name,
                        val.dtype,
                        val.shape,
                    )
                    assert val.tobytes() == exp.tobytes(), (i, f.name)


@V1_ROWS
def test_values_by_row(g):
    check_v1_rows(g.path)


@V1_ROWS
@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("varlen", ["ragged", "padded"])
def test_values_by_take(g, rs, verify, varlen):
    r = rowstore.open(g.path, verify=verify)
    rows = expected_rows(expected(V1), r.schema)
    order = np.array([35, 0, 17, 8, 7, 33, 16, 16, 1])
    batch = r.take(order, varlen=varlen)
    if varlen == "ragged":
        rs.assert_batch_equal(r.schema, [rows[i] for i in order], batch)
    else:
        for f in r.schema:
            if not f.is_variable:
                continue
            shp = batch[f.name + "__shape"]
            for j, i in enumerate(order):
                v = rows[i][f.name]
                assert tuple(shp[j]) == tuple(v.shape[d] for d in f.variable_dims)
                assert (
                    batch[f.name][j][tuple(slice(0, s) for s in v.shape)].tobytes() == v.tobytes()
                )
    # a whole epoch in batches sees every row once
    seen = []
    for b in r.batches(5, shuffle="block", seed=3, num_threads=2):
        seen += b["id"].tolist()
    assert sorted(seen) == sorted(int(row["id"]) for row in rows)


@V1_ROWS
def test_special_values(g):
    r = rowstore.open(g.path)
    scores = r.take(np.arange(36))["score"]
    assert np.isnan(scores[0]) and np.isposinf(scores[9]) and np.isneginf(scores[18])
    assert (
        scores[3] == 0 and np.signbit(scores[3]) and scores[12] == 0 and not np.signbit(scores[12])
    )
    assert scores[15] == np.float32(3.4e38) and scores[1] == np.float32(1 / 7)
    assert r[0]["note"] is None and r[2]["maybe"] is None and r[0]["maybe"] == -20
    assert (
        r[3]["grid"].shape == (3, 0)
        and r[0]["wave"].shape == (0,)
        and r[0]["pairs"].shape == (0, 2)
    )
    assert r[4]["label"] == "日本語" and r[5]["label"] == "😀 emoji #5"


# --- v1 ----------------------------------------------------------------------------------------


def test_v1_layout():
    layout = Layout.open(V1.path, scan=True)
    exp = expected(V1)["layout"]
    assert layout.num_rows == exp["num_rows"] == 36
    assert layout.rows_per_block == exp["rows_per_block"] == 8
    assert layout.num_blocks == exp["num_blocks"] == 5
    assert layout.row_dtype.itemsize == exp["row_itemsize"]
    assert layout.heap_chunk_bytes == exp["heap_chunk_bytes"] == 256
    assert layout.heap_nbytes == exp["heap_nbytes"]
    assert len(layout.heap_chunks) == exp["num_heap_chunks"] > 1
    assert (
        layout.compression
        == exp["compression"]
        == {"id": "blosc2", "cname": "lz4", "clevel": 5, "shuffle": "byte"}
    )
    assert layout.blocks["num_rows"].tolist() == [8, 8, 8, 8, 4]
    assert layout.file_size == os.path.getsize(V1.path)


def test_v1_on_disk_layout_matches_the_spec():
    """The row table's compound dtype, the attributes and the filters are what format v1 says."""
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401

    schema = Layout.open(V1.path).schema
    with h5py.File(V1.path, "r") as f:
        g = f["rowstore"]
        assert g["rows"].dtype == spec.row_dtype(schema)
        assert g["rows"].dtype.names[:7] == tuple(V1_NAMES[:6]) + ("maybe__null",)
        assert (
            g["blocks"].dtype == spec.BLOCK_DTYPE
            and g["heap_chunks"].dtype == spec.HEAP_CHUNK_DTYPE
        )
        assert g.attrs["format"] == "rowstore" and g.attrs["checksum"] == "crc32"
        assert list(g["rows"]._filters) == ["32026"] and list(g["heap"]._filters) == ["32026"]
        assert g["rows"].chunks == (8,) and g["heap"].chunks == (256,)


def test_v1_make_script_refuses_with_one_of_its_files_present(tmp_path):
    """With only the JSON left, the script still refuses and creates nothing."""
    for name in ("make_golden_v1.py", "golden_v1.json"):
        shutil.copy(os.path.join(DATA, name), tmp_path / name)
    proc = _run_script(str(tmp_path / "make_golden_v1.py"))
    assert proc.returncode != 0 and not os.path.exists(tmp_path / "golden_v1.h5")


def test_v1_make_script_still_describes_the_golden_content(tmp_path):
    """Run the script in an empty directory: the current writer stores the same values with the
    same block layout (stored sizes may differ with compressor versions, so they are not
    compared)."""
    shutil.copy(V1.script, tmp_path / "make_golden_v1.py")
    proc = _run_script(str(tmp_path / "make_golden_v1.py"))
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "golden_v1.json", encoding="utf-8") as f:
        fresh = json.load(f)
    exp = expected(V1)
    assert fresh["rows"] == exp["rows"]
    assert fresh["schema"] == exp["schema"]
    for key in (
        "num_rows",
        "rows_per_block",
        "num_blocks",
        "row_itemsize",
        "heap_chunk_bytes",
        "compression",
    ):
        assert fresh["layout"][key] == exp["layout"][key], key
    for name in ("first_row", "num_rows"):
        assert fresh["layout"]["blocks"][name] == exp["layout"]["blocks"][name]


# --- v3_lz4: compressed, memcpy'd heap chunks --------------------------------------------------


LZ4 = GOLDEN["v3_lz4"]


@pytest.fixture(scope="module")
def lz4_made():
    """The script that made golden_v3_lz4 (its row formulas and sizes)."""
    sys.path.insert(0, DATA)
    try:
        import make_golden_v3_lz4 as made
    finally:
        sys.path.remove(DATA)
    return made


def test_v3_lz4_memcpyed_chunks():
    """Most heap chunks are memcpy'd (their raw bytes in the file as they are), the last one,
    zero-padded, compressed."""
    L = Layout.open(LZ4.path)
    starts = memcpyed_starts(LZ4.path)
    assert starts.tolist() == expected(LZ4)["memcpyed_raw_offsets"]
    assert (starts[:-1] >= 0).all() and starts[-1] == -1
    raw = _h5_raw(LZ4, "heap", L.heap_chunk_bytes)
    with open(LZ4.path, "rb") as f:
        data = f.read()
    H = L.heap_chunk_bytes
    for c, at in enumerate(starts[:-1].tolist()):
        assert data[at : at + H] == raw[c * H : (c + 1) * H]


@pytest.mark.parametrize("verify", [True, False, "always"])
def test_v3_lz4_values(lz4_made, verify):
    exp = expected(LZ4)
    with rowstore.open(LZ4.path, verify=verify) as r:
        assert len(r) == lz4_made.NUM_ROWS == len(exp["rows"])
        got = r.take(list(range(len(r))))
        for i, want in enumerate(exp["rows"]):
            assert int(got["id"][i]) == want["id"]
            assert hashlib.sha256(bytes(got["blob"][i])).hexdigest() == want["blob_sha256"]
            assert got["text"][i] == want["text"]
            assert bytes(got["blob"][i]) == lz4_made.blob(i)
        seen = sorted(int(i) for b in r.batches(7, shuffle="full", seed=1) for i in b["id"])
        assert seen == list(range(len(r)))


def test_v3_lz4_flipped_payload_byte_is_refused(lz4_made, tmp_path):
    """A byte flipped in a memcpy'd chunk's payload is refused by the page check of the read
    that touches it, with no whole-chunk read."""
    bad = str(tmp_path / "bad.h5")
    shutil.copyfile(LZ4.path, bad)
    at = expected(LZ4)["memcpyed_raw_offsets"][1] + 4096 + 5  # heap chunk 1, page 1
    with open(bad, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))
    H = lz4_made.HEAP_CHUNK_BYTES
    target = _h5_raw(LZ4, "heap", H)[H + 4096 : H + 4096 + 32]  # the row whose blob holds it
    row = next(i for i in range(lz4_made.NUM_ROWS) if target in lz4_made.blob(i))
    with rowstore.open(bad) as r, pytest.raises(ChecksumError, match="field 'blob'"):
        r.take([row], fields=["blob"])
    with rowstore.open(bad, verify=False) as r:  # what verify=True refused to hand out
        assert bytes(r.take([row], fields=["blob"])["blob"][0]) != lz4_made.blob(row)


# --- dataset_v1: a dataset directory of manifest format v1 -------------------------------------


DATASET = GOLDEN["dataset_v1"]


@pytest.mark.parametrize("verify", [True, "always"])
def test_dataset_v1_reads_every_value(rs, verify):
    exp = expected(DATASET)
    schema = Schema.from_json(exp["schema"])
    rows = expected_rows(exp, schema)
    with rowstore.open(DATASET.path, verify=verify) as r:
        assert r.schema == schema and r.layout.user_attrs == exp["attrs"]
        assert r.layout.version == 2 and len(r) == exp["versions"]["2"] == len(rows)
        assert r.layout.num_shards == len(exp["shards"])
        assert list(r.layout.shard_rpb) == [s["rows_per_block"] for s in exp["shards"]]
        rs.assert_batch_equal(schema, rows, r.take(np.arange(len(rows))))
        order = r.epoch_order(shuffle="block", seed=3, window=2)
        got = rowstore.reader.buffers.concat_batches(
            list(r.batches(5, shuffle="block", seed=3, window=2))
        )
        rs.assert_batch_equal(schema, [rows[i] for i in order], got)
    with rowstore.open(DATASET.path, version=1) as r:
        assert len(r) == exp["versions"]["1"]
        rs.assert_batch_equal(schema, rows[: len(r)], r.take(np.arange(len(r))))


def test_dataset_v1_manifest_matches_the_spec():
    exp = expected(DATASET)
    root = DATASET.path
    m = manifest.load(root)
    assert m.version == 2 and manifest.versions(root) == [1, 2]
    assert [
        dict(zip(manifest.SHARD_KEYS, vals))
        for vals in zip(m.shards["path"], *(m.shards[k].tolist() for k in manifest.SHARD_KEYS[1:]))
    ] == exp["shards"]
    with open(os.path.join(root, manifest.manifest_path(2)), encoding="utf-8") as f:
        raw = json.load(f)
    assert (
        raw["format"] == "rowstore-dataset"
        and raw["format_version"] == exp["manifest_format_version"] == 1
        and raw["kind"] == "shards"
    )
    assert raw["parent"] == 1 and raw["num_rows"] == exp["versions"]["2"]
    # Each shard is an ordinary v1 file on its own, and its index is the sidecar's.
    for s in exp["shards"]:
        L = rowstore.Layout.open(os.path.join(root, s["path"]), scan=True)
        assert manifest.index_crc32(L.blocks, L.heap_chunks) == s["index_crc32"]
