"""Structure-aware mutation fuzzer for rowstore readers.

    python tools/robustness/fuzz.py --minutes N [--seed S] [--out bench/results/fuzz.json]
    python tools/robustness/fuzz.py --cases N [--region all|chunks|metadata|index] [--seed S]
    python tools/robustness/fuzz.py --cases N --region manifest|sealed|shard|datasets|alias
    (dataset targets)

Seed files are format v2 (a checksummed footer after the HDF5 file; ``--format v1`` cuts it off
and sets ``format_version`` 1, as the v1 writer left files). ``--region footer``: the footer's and
trailer's bytes as stored (bit flips, set and zeroed bytes: the CRCs must refuse them) and sealed
edits (a header value or an index record field changed, both CRCs recomputed: the semantic checks
must); ``all`` includes them, and truncation at the footer's inner boundaries.

Seed files: small valid rowstore files (uncompressed and lz4; int64, float32[4], nullable str,
variable int16 (None, 2), an 8x8x3 PNG when imagecodecs is present; 50 rows, rows_per_block=8,
heap_chunk_bytes=256) built in a temporary directory. Their structures (block chunks, heap
chunks, the index datasets) are located with h5py (``get_chunk_info``, ``id.get_offset()``);
everything else in the file is HDF5 metadata (superblock, object headers, B-trees, heaps, free
space).

Each case applies one to three mutations (see ``KINDS``) and runs the oracle in a child process
(spawned, ``RLIMIT_AS`` 4 GiB, many cases per child, restarted after a crash or hang): open,
``r[0]``, ``take`` of all rows, ``batches`` in block/full/none, ``Layout.verify()`` and
``rowstore verify``. Outcomes, worst step wins:

    ok            every step returned and every value equals what was written
    rowstore-error  a RowstoreError (or OSError with an errno; ``rowstore verify`` exiting 1)
    WRONG-DATA    a step returned without error but a value (or the row count) differs
    LEAKED        any other exception (MemoryError included: an allocation beyond the bounds)
    CRASH         the child was killed by a signal
    HANG          the case ran past --timeout seconds

Every case other than ok/rowstore-error is saved under ``bench/results/fuzz-cases/`` (the mutated
file and a JSON of its mutations); ``--out`` gets counts per outcome and per mutation kind.

Dataset targets (``--region manifest|sealed|shard|datasets|alias``): seeds are two datasets
(raw, lz4) of the same 50 rows in four shards of 4, 8, 3 and 5 rows per block, the fourth
appended as version 2. ``manifest``: bytes of the pointer, manifest and sidecar as stored
(flip, set, zero, truncate, extend). ``sealed``: structure-aware edits of manifest fields (shard
counts and sizes, paths, schema, compression, header keys, deleted keys, wrong JSON types), of the
pointer and of sidecar records, each followed by :func:`reseal` (every CRC recomputed) so the
semantic checks are what refuse it. ``shard``: the chunk and index mutations above, in one shard
file. ``datasets``: those three. ``alias``: sealed schema edits that leave a consistent dataset
of other values (same-size dtype, renamed field): no reader can refute them from the manifest,
only ``rowstore verify`` (each shard's own schema); run apart, its WRONG-DATA is the design's
limit. The oracle is the same, on the directory, plus ``layout.damage()``; the expected rows are
the committed rows in order. Saved cases are directories; ``--replay`` takes them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # fuzz this checkout's rowstore (spawned children run this too)
    sys.path.insert(0, ROOT)

N_ROWS = 50
OUTCOMES = ("ok", "rowstore-error", "WRONG-DATA", "LEAKED", "CRASH", "HANG")
SEVERITY = {o: i for i, o in enumerate(OUTCOMES)}
BAD = ("WRONG-DATA", "LEAKED", "CRASH", "HANG")


# --------------------------------------------------------------------------- seeds


def _has_imagecodecs() -> bool:
    try:
        import imagecodecs  # noqa: F401
    except ImportError:
        return False
    return True


def seed_schema(with_image: bool):
    from rowstore import Field, Schema

    fields = [
        Field("id", "int64"),
        Field("x", "float32", (4,)),
        Field("s", "str", nullable=True),
        Field("v", "int16", (None, 2)),
    ]
    if with_image:
        fields.append(Field("img", "uint8", (8, 8, 3), codec="png"))
    return Schema(fields)


def seed_rows(with_image: bool) -> list[dict]:
    rows = []
    for i in range(N_ROWS):
        row = {
            "id": i,
            "x": np.full(4, i * 0.5, np.float32),
            "s": None if i % 4 == 0 else f"s{i}",
            "v": np.full((i % 3, 2), i, np.int16),
        }
        if with_image:
            row["img"] = (np.arange(192, dtype=np.uint8).reshape(8, 8, 3) + i).astype(np.uint8)
        rows.append(row)
    return rows


def build_seeds(tmp: str, with_image: bool) -> dict[str, str]:
    import rowstore

    out = {}
    for comp in (None, "lz4"):
        name = f"seed-{comp or 'raw'}"
        path = os.path.join(tmp, name + ".h5")
        with rowstore.Writer(
            path, seed_schema(with_image), compression=comp, rows_per_block=8, heap_chunk_bytes=256
        ) as w:
            for r in seed_rows(with_image):
                w.write(r)
        out[name] = path
    return out


def as_v1(path: str) -> None:
    """Make a v2 file what the v1 writer left: the footer cut off, ``format_version`` 1."""
    import h5py

    from rowstore import Layout
    from rowstore.format import footer

    footer.cut(path, Layout.open(path).footer_offset)
    with h5py.File(path, "r+") as f:
        f["rowstore"].attrs["format_version"] = 1
        if "has_footer" in f["rowstore"].attrs:  # the v1 writer did not write it
            del f["rowstore"].attrs["has_footer"]


def structure_map(path: str) -> dict:
    """Byte ranges of every structure: block chunks, heap chunks, index datasets; the rest is
    metadata. Also the positions of heap-reference columns inside a row and the row size."""
    import h5py

    regions = []  # (kind, start, end)
    with h5py.File(path, "r") as f:
        g = f["rowstore"]
        compressed = bool(g["rows"].compression or g["rows"]._filters)
        for name, kind in (("rows", "block"), ("heap", "heap")):
            if name not in g:
                continue
            ds = g[name]
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                regions.append((kind, int(info.byte_offset), int(info.byte_offset + info.size)))
        for name in ("blocks", "heap_chunks"):
            if name in g:
                ds = g[name]
                off = ds.id.get_offset()
                if off is not None:
                    regions.append(("index", int(off), int(off + ds.id.get_storage_size())))
        dt = g["rows"].dtype
        refs = []  # (start within row, length, what)
        for fname in dt.names:
            sub, base = dt.fields[fname][:2]
            if sub.names and "offset" in sub.names:
                for part in sub.names:
                    pdt, poff = sub.fields[part][:2]
                    refs.append((base + poff, pdt.itemsize, f"{fname}.{part}"))
        row_size = dt.itemsize
    size = os.path.getsize(path)
    from rowstore import Layout

    footer_offset = Layout.open(path).footer_offset
    footer = None
    if footer_offset:  # v2: the footer (header + index) and the trailer are regions of their own
        with open(path, "rb") as fh:
            fh.seek(footer_offset)
            tail = fh.read()
        hlen = int.from_bytes(tail[8:12], "little")
        regions.append(("footer", footer_offset, size - 32))
        regions.append(("trailer", size - 32, size))
        footer = {
            "offset": footer_offset,
            "header": (footer_offset + 12, footer_offset + 12 + hlen),
            "index": footer_offset + 20 + hlen,
        }
    regions.sort(key=lambda r: r[1])
    meta, pos = [], 0
    for _, a, b in regions:
        if a > pos:
            meta.append(("metadata", pos, a))
        pos = max(pos, b)
    if pos < size:
        meta.append(("metadata", pos, size))
    return {
        "size": size,
        "compressed": compressed,
        "regions": regions,
        "metadata": meta,
        "refs": refs,
        "row_size": row_size,
        "footer": footer,
    }


# --------------------------------------------------------------------------- mutations

CHUNK_KINDS = (
    "chunk-bitflip",
    "chunk-setbyte",
    "chunk-zero",
    "row-bytes",
    "heap-ref",
    "blosc-frame-header",
    "blosc-chunk-header",
)
META_KINDS = ("meta-bitflip", "meta-setbyte", "meta-zero")
INDEX_KINDS = ("index-bitflip", "index-setbyte")
FILE_KINDS = (
    "bitflip",
    "setbyte",
    "zero-range",
    "insert-garbage",
    "truncate-random",
    "truncate-boundary",
    "append-garbage",
)
#: Format v2 footer: its bytes as stored (the CRCs must refuse them), and sealed edits (a header
#: value or an index record field changed, both CRCs recomputed: the semantic checks must).
FOOTER_KINDS = ("footer-bitflip", "footer-setbyte", "footer-zero", "footer-sealed")
KINDS = {
    "chunks": CHUNK_KINDS,
    "metadata": META_KINDS,
    "index": INDEX_KINDS,
    "footer": FOOTER_KINDS,
    "all": CHUNK_KINDS + META_KINDS + INDEX_KINDS + FOOTER_KINDS + FILE_KINDS,
}


def _pick_region(rng, smap, kinds):
    cands = (
        [r for r in smap["regions"] if r[0] in kinds]
        if kinds != ("metadata",)
        else smap["metadata"]
    )
    cands = [r for r in cands if r[2] > r[1]]
    return cands[rng.integers(len(cands))] if cands else None


def _flip(data, rng, a, b):
    p = int(rng.integers(a, b))
    bit = int(rng.integers(8))
    data[p] ^= 1 << bit
    return {"op": "flip", "at": p, "bit": bit}


def _set(data, rng, a, b):
    p = int(rng.integers(a, b))
    v = int(rng.choice([0, 0xFF, 0x7F, 0x80, 1, int(rng.integers(256))]))
    old = data[p]
    data[p] = v if v != old else (v ^ 0x55)
    return {"op": "set", "at": p, "value": data[p]}


def _zero(data, rng, a, b):
    p = int(rng.integers(a, b))
    n = int(min(b - p, rng.integers(1, 65)))
    data[p : p + n] = bytes(n)
    return {"op": "zero", "at": p, "n": n}


def _chunk_mutation(kind, data, rng, smap):
    """A mutation inside one block or heap chunk; returns the op (or None if not applicable)."""
    if kind in ("blosc-frame-header", "blosc-chunk-header") and not smap["compressed"]:
        kind = "chunk-setbyte"
    if kind in ("row-bytes", "heap-ref"):
        reg = _pick_region(rng, smap, ("block",))
    else:
        reg = _pick_region(rng, smap, ("block", "heap"))
    if reg is None:
        return None
    _, a, b = reg
    if kind == "chunk-bitflip":
        return _flip(data, rng, a, b)
    if kind == "chunk-setbyte":
        return _set(data, rng, a, b)
    if kind == "chunk-zero":
        return _zero(data, rng, a, b)
    if kind == "row-bytes":
        if smap["compressed"]:  # payload after the frame and chunk headers
            h = int.from_bytes(bytes(data[a + 11 : a + 15]), "big")
            lo = min(b - 1, a + h + 32)
            return _set(data, rng, lo, b)
        return _set(data, rng, a, b)
    if kind == "heap-ref":
        if smap["compressed"] or not smap["refs"]:
            return _set(data, rng, a, b)
        row = int(rng.integers((b - a) // smap["row_size"]))
        start, length, what = smap["refs"][int(rng.integers(len(smap["refs"])))]
        p = a + row * smap["row_size"] + start
        val = int(rng.choice([0, 1, 2**31, 2**32 - 1, int(rng.integers(0, 4096))]))
        if length == 8:
            val = int(rng.choice([val, 2**63, 2**64 - 1]))
        chunk = (
            np.frombuffer(bytes(data[p : p + length]), f"<u{length}").copy()
            if length in (1, 2, 4, 8)
            else None
        )
        if chunk is None:  # the shape column: (k,) <u4
            p += 4 * int(rng.integers(length // 4))
            length = 4
        data[p : p + length] = int(val % (1 << (8 * length))).to_bytes(length, "little")
        return {"op": "heap-ref", "at": p, "field": what, "value": val % (1 << (8 * length))}
    if kind == "blosc-frame-header":
        h = int.from_bytes(bytes(data[a + 11 : a + 15]), "big")
        hi = a + (h if 16 <= h <= b - a else 32)
        return _set(data, rng, a, min(hi, b))
    if kind == "blosc-chunk-header":
        h = int.from_bytes(bytes(data[a + 11 : a + 15]), "big")
        lo = a + h if 16 <= h < b - a else a
        return _set(data, rng, lo, min(lo + 32, b))
    raise AssertionError(kind)


def _footer_sealed(data: bytearray, rng, smap) -> tuple[bytearray, dict | None]:
    """Change one header value or one index record field of a v2 footer and recompute its CRCs."""
    from rowstore.format import footer, spec

    ft = smap["footer"]
    if ft is None:
        return data, None
    off = ft["offset"]
    h0, h1 = ft["header"]
    header = json.loads(bytes(data[h0:h1]))
    index = bytearray(data[ft["index"] + 8 : len(data) - footer.TRAILER_SIZE])
    nb = -(-int(header["num_rows"]) // int(header["rows_per_block"]))
    if rng.random() < 0.4:
        key = _pick(
            rng,
            [
                "num_rows",
                "rows_per_block",
                "heap_chunk_bytes",
                "heap_nbytes",
                "format_version",
                footer.KEY_EOF,
            ],
        )
        old = header[key]
        header[key] = _odd_int(rng, int(old))
        op = {"op": "footer-sealed", "key": key, "old": old, "value": header[key]}
    else:
        heap = rng.random() < 0.3 and len(index) > nb * spec.BLOCK_DTYPE.itemsize
        dt = spec.HEAP_CHUNK_DTYPE if heap else spec.BLOCK_DTYPE
        base = nb * spec.BLOCK_DTYPE.itemsize if heap else 0
        count = (len(index) - base) // dt.itemsize if heap else nb
        if not count:
            return data, None
        rec = np.frombuffer(bytes(index[base : base + count * dt.itemsize]), dt).copy()
        k, field = int(rng.integers(count)), _pick(rng, list(dt.names))
        old = int(rec[field][k])
        rec[field][k] = _odd_int(rng, old) % (1 << 64)
        index[base : base + count * dt.itemsize] = rec.tobytes()
        op = {
            "op": "footer-sealed",
            "record": ("heap chunk " if heap else "block ") + str(k),
            "field": field,
            "old": old,
            "value": int(rec[field][k]),
        }
    text = json.dumps(header, sort_keys=True).encode()
    body = (
        footer.FOOTER_MAGIC
        + len(text).to_bytes(4, "little")
        + text
        + bytes(data[ft["index"] : ft["index"] + 8])
        + bytes(index)
    )
    head = (
        footer.TRAILER_MAGIC
        + off.to_bytes(8, "little")
        + len(body).to_bytes(8, "little")
        + zlib.crc32(body).to_bytes(4, "little")
    )
    return data[:off] + body + head + zlib.crc32(head).to_bytes(4, "little"), op


def mutate(kind: str, data: bytearray, rng, smap) -> tuple[bytearray, dict | None]:
    n = len(data)
    if kind == "footer-sealed":
        try:
            return _footer_sealed(data, rng, smap)
        except (
            ValueError,
            KeyError,
            TypeError,
            OverflowError,
        ):  # an earlier mutation of this case broke the footer
            return data, None
    if kind in FOOTER_KINDS:
        reg = _pick_region(rng, smap, ("footer", "trailer"))
        if reg is None:
            return data, None
        fn = {"bitflip": _flip, "setbyte": _set, "zero": _zero}[kind.split("-", 1)[1]]
        return data, fn(data, rng, reg[1], reg[2])
    if kind in CHUNK_KINDS:
        return data, _chunk_mutation(kind, data, rng, smap)
    if kind in META_KINDS or kind in INDEX_KINDS:
        reg = _pick_region(rng, smap, ("metadata",) if kind in META_KINDS else ("index",))
        if reg is None:
            return data, None
        _, a, b = reg
        fn = {"bitflip": _flip, "setbyte": _set, "zero": _zero}[kind.split("-", 1)[1]]
        return data, fn(data, rng, a, b)
    if kind == "bitflip":
        return data, _flip(data, rng, 0, n)
    if kind == "setbyte":
        return data, _set(data, rng, 0, n)
    if kind == "zero-range":
        return data, _zero(data, rng, 0, n)
    if kind == "insert-garbage":
        p = int(rng.integers(0, n))
        g = rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8).tobytes()
        return data[:p] + g + data[p:], {"op": "insert", "at": p, "n": len(g)}
    if kind == "append-garbage":
        g = rng.integers(0, 256, int(rng.integers(1, 4097)), dtype=np.uint8).tobytes()
        return data + g, {"op": "append", "n": len(g)}
    if kind == "truncate-random":
        p = int(rng.integers(0, n))
        return data[:p], {"op": "truncate", "at": p}
    if kind == "truncate-boundary":
        bounds = sorted(
            {x for r in smap["regions"] for x in (r[1], r[2])}
            | {p for r in smap["regions"] for p in (r[1] + 1, r[2] - 1)}
        )
        if smap.get("footer"):
            ft = smap["footer"]
            bounds += [
                ft["offset"] + 8,
                ft["offset"] + 12,
                ft["header"][1],
                ft["index"],
                ft["index"] + 8,
                n - 32 + 8,
                n - 4,
            ]
        bounds = [x for x in bounds if 0 < x < n]
        p = int(bounds[int(rng.integers(len(bounds)))])
        return data[:p], {"op": "truncate", "at": p, "boundary": True}
    raise AssertionError(kind)


# --------------------------------------------------------------------------- dataset targets
#
# A dataset seed is a directory (pointer, manifest, sidecar, shards) held in memory as
# ``{relative path: bytes}``; a case is that dict mutated, written to a fresh directory. Three
# regions: ``manifest`` (bytes of the pointer, manifest and sidecar as stored: the CRCs must
# refuse them), ``sealed`` (structure-aware JSON and sidecar record edits re-sealed with correct
# CRCs: they reach the semantic checks), ``shard`` (the chunk mutations of one shard file; the
# manifest's recorded file_size still holds). ``datasets`` is all three.

#: Shards of a dataset seed: (first row, end row, rows_per_block), then the second version's.
DS_SHARDS = ((0, 12, 4), (12, 30, 8), (30, 38, 3))
DS_APPEND = ((38, 50, 5),)
DS_TARGETS = ("pointer", "manifest", "sidecar")
DS_BYTE_OPS = ("bitflip", "setbyte", "zero", "truncate", "extend")
DS_BYTE_KINDS = tuple(f"{t}-{op}" for t in DS_TARGETS for op in DS_BYTE_OPS)
SEALED_KINDS = (
    "sealed-shard-int",
    "sealed-shard-path",
    "sealed-schema",
    "sealed-compression",
    "sealed-header",
    "sealed-pointer",
    "sealed-delete-key",
    "sealed-type",
    "sealed-sidecar",
)
#: Same-size dtype and shape changes of the schema: a consistent dataset whose bytes mean other
#: values. Nothing a reader opens can tell (the manifest is the schema's only source the read
#: path uses; ``rowstore verify`` compares each shard's own): a limit of the design, not in
#: ``sealed``/``datasets``, run on its own to measure it.
ALIAS_KINDS = ("sealed-schema-alias",)
DS_SHARD_KINDS = tuple("shard-" + k for k in CHUNK_KINDS + INDEX_KINDS)
DATASET_KINDS = {
    "manifest": DS_BYTE_KINDS,
    "sealed": SEALED_KINDS,
    "shard": DS_SHARD_KINDS,
    "datasets": DS_BYTE_KINDS + SEALED_KINDS + DS_SHARD_KINDS,
    "alias": ALIAS_KINDS,
}
KINDS.update(DATASET_KINDS)


def build_dataset_seeds(tmp: str, with_image: bool) -> dict[str, str]:
    """Two datasets (raw, lz4) of the seed rows: three shards of different rows_per_block in
    version 1, a fourth appended in version 2 (``mode="a"``)."""
    import rowstore

    schema, rows = seed_schema(with_image), seed_rows(with_image)
    out = {}
    for comp in (None, "lz4"):
        name = f"ds-{comp or 'raw'}"
        root = os.path.join(tmp, name)
        for mode, parts in (("w", DS_SHARDS), ("a", DS_APPEND)):
            infos = [
                rowstore.write_shard(
                    root,
                    schema,
                    rows[a:z],
                    rows_per_block=k,
                    compression=comp,
                    heap_chunk_bytes=256,
                    name=f"s{a:02d}-{z:02d}",
                )
                for a, z, k in parts
            ]
            rowstore.commit(root, infos, mode=mode)
        out[name] = root
    return out


def read_tree(root: str) -> dict[str, bytes]:
    """Every file under ``root`` (the commit lock left out), by relative path."""
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            full = os.path.join(d, n)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if not rel.endswith("/.lock"):
                with open(full, "rb") as fh:
                    files[rel] = fh.read()
    return files


def write_tree(root: str, files: dict[str, bytes]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    for rel, data in files.items():
        full = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(data)


def tree_digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha1()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha1(files[rel]).digest())
    return h.hexdigest()[:10]


def dataset_map(root: str) -> dict:
    """Where a dataset seed's objects are: pointer, manifest and sidecar paths, the manifest
    parsed, each shard's entry and :func:`structure_map`."""
    from rowstore.format import manifest as mf

    with open(os.path.join(root, mf.POINTER), "rb") as fh:
        pointer = json.loads(fh.read())
    with open(os.path.join(root, pointer["manifest"]), "rb") as fh:
        m = json.loads(fh.read())
    shards = [dict(e) for e in m["shards"]]
    return {
        "root": os.path.abspath(root),
        "pointer": mf.POINTER,
        "manifest": pointer["manifest"],
        "sidecar": m["index"]["path"],
        "json": m,
        "shards": shards,
        "smaps": {e["path"]: structure_map(os.path.join(root, e["path"])) for e in shards},
        "versions": mf.versions(root),
    }


def _sidecar_arrays(data: bytes, m: dict) -> tuple[np.ndarray, np.ndarray]:
    from rowstore.format import manifest as mf
    from rowstore.format import spec

    nb = sum(e["blocks"] for e in m["shards"])
    body = np.frombuffer(data[len(mf.INDEX_MAGIC) :], np.uint8)
    split = nb * spec.BLOCK_DTYPE.itemsize
    return body[:split].view(spec.BLOCK_DTYPE).copy(), body[split:].view(
        spec.HEAP_CHUNK_DTYPE
    ).copy()


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 40


def reseal(files: dict[str, bytes], dmap: dict, keep: frozenset = frozenset()) -> None:
    """Recompute every checksum a reader compares after a sealed edit: each shard's
    ``index_crc32`` (from the sidecar sliced by the manifest's counts, where they are usable),
    the sidecar's ``crc32``/``nbytes`` and the pointer's ``manifest_crc32``. ``keep``: fields the
    edit set on purpose (``"index_crc32"``, ``"index"``, ``"pointer"``) are left as edited."""
    from rowstore.format import manifest as mf
    from rowstore.format import spec

    m = json.loads(files[dmap["manifest"]])
    side = files.get(dmap["sidecar"])
    entries = m.get("shards") if isinstance(m, dict) else None
    if side is not None and isinstance(entries, list) and "index_crc32" not in keep:
        ok = [
            isinstance(e, dict) and _is_count(e.get("blocks")) and _is_count(e.get("heap_chunks"))
            for e in entries
        ]
        if all(ok):
            nb = sum(e["blocks"] for e in entries)
            body = side[len(mf.INDEX_MAGIC) :]
            bsz, hsz = spec.BLOCK_DTYPE.itemsize, spec.HEAP_CHUNK_DTYPE.itemsize
            b0, h0 = 0, nb * bsz
            for e in entries:
                bl = body[b0 : b0 + e["blocks"] * bsz]
                hc = body[h0 : h0 + e["heap_chunks"] * hsz]
                e["index_crc32"] = zlib.crc32(hc, zlib.crc32(bl))
                b0, h0 = b0 + len(bl), h0 + len(hc)
    if (
        side is not None
        and isinstance(m, dict)
        and isinstance(m.get("index"), dict)
        and "index" not in keep
    ):
        idx = m["index"]
        for k, v in (("nbytes", len(side)), ("crc32", zlib.crc32(side))):
            if k in idx:
                idx[k] = v
    text = json.dumps(m, indent=1).encode()
    files[dmap["manifest"]] = text
    if "pointer" not in keep:
        p = json.loads(files[dmap["pointer"]])
        if isinstance(p, dict) and "manifest_crc32" in p:
            p["manifest_crc32"] = zlib.crc32(text)
        files[dmap["pointer"]] = json.dumps(p, indent=1).encode() + b"\n"


def _odd_int(rng, v: int):
    """A number next to, far from or outside what a count or size ``v`` may be."""
    return [
        0,
        -1,
        1,
        v + 1,
        v - 1,
        2 * v,
        v + 4096,
        2**31,
        2**32,
        2**62,
        2**63 - 1,
        2**63,
        2**64 + v,
        -(2**63),
    ][int(rng.integers(14))]


def _odd_value(rng):
    """A JSON value of the wrong type."""
    return [None, True, False, 1.5, "7", "", [], {}, [1, 2], {"a": 1}, 1e308, -0.0][
        int(rng.integers(12))
    ]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _schema_edit(rng, schema: dict, alias: bool) -> dict:
    """An edit of one field (or of the field list) of the schema JSON, in place.

    ``alias``: an edit under which the stored bytes still read as a consistent dataset of other
    values (a same-size dtype or shape, a renamed field, the dtype of a heap field, whose empty
    values have no bytes to disagree). Otherwise: edits that change
    what a row or a payload holds (sizes, heap or inline, nullability, codecs), or are invalid."""
    fields = schema["fields"]
    i = int(rng.integers(len(fields)))
    f = fields[i]
    inline = [
        k
        for k, fl in enumerate(fields)
        if fl["dtype"] not in ("str", "bytes")
        and None not in fl["shape"]
        and fl["codec"].get("id") == "raw"
    ]
    if alias:
        alias_of = {"<i8": ("<f8", "<u8", "<M8[ns]"), "<f4": ("<i4", "<u4"), "<i2": ("<u2", "<f2")}
        how = _pick(rng, ("dtype", "dtype", "shape", "rename", "heap-dtype"))
        if how == "shape" and f["name"] == "x":
            old, f["shape"] = f["shape"], [2, 2]
            return {"field": f["name"], "shape": [old, f["shape"]]}
        if how == "rename":
            old, f["name"] = f["name"], f["name"] + "_renamed"
            return {"field": old, "name": f["name"]}
        if how == "heap-dtype" and any(fl["name"] == "v" for fl in fields):
            f = next(fl for fl in fields if fl["name"] == "v")
            old, f["dtype"] = f["dtype"], _pick(rng, ("<f8", "<i4", "|u1"))
            return {"field": "v", "dtype": [old, f["dtype"]]}
        f = fields[_pick(rng, [k for k in inline if fields[k]["dtype"] in alias_of])]
        old, f["dtype"] = f["dtype"], _pick(rng, alias_of[f["dtype"]])
        return {"field": f["name"], "dtype": [old, f["dtype"]]}
    what = _pick(rng, ("dtype", "shape", "nullable", "codec", "name", "drop", "add", "type"))
    if what in ("dtype", "shape"):
        f = fields[_pick(rng, inline)]
    if what == "dtype":  # another size, or not a dtype
        size = {"<i8": 8, "<f4": 4}.get(f["dtype"])
        cands = [
            d
            for d in (
                "<i4",
                "<f8",
                "<i2",
                "|u1",
                "str",
                "bytes",
                "<c16",
                "O",
                "<U4",
                "",
                "<i0",
                "V8",
                "<m8",
                "<f2",
            )
            if {
                "<i4": 4,
                "<f8": 8,
                "<i2": 2,
                "|u1": 1,
                "<c16": 16,
                "V8": 8,
                "<m8": 8,
                "<f2": 2,
            }.get(d)
            != size
        ]
        old, f["dtype"] = f["dtype"], _pick(rng, cands)
        return {"field": f["name"], "dtype": [old, f["dtype"]]}
    if what == "shape":  # another number of elements, variable, or invalid
        old = f["shape"]
        n_old = int(np.prod(old)) if old else 1
        cands = [
            sh
            for sh in (
                [],
                [3],
                [5],
                [None],
                [None, None],
                [0],
                [-1],
                [2**40, 2**40],
                [None, 3],
                [1.5],
                "4",
                [4, None],
                [8],
            )
            if not isinstance(sh, list)
            or None in sh
            or not all(isinstance(d, int) for d in sh)
            or int(np.prod(sh or [1])) != n_old
        ]
        f["shape"] = _pick(rng, cands)
        return {"field": f["name"], "shape": [old, f["shape"]]}
    if what == "nullable":
        f["nullable"] = not f["nullable"]
        return {"field": f["name"], "nullable": f["nullable"]}
    if what == "codec":
        f["codec"] = _pick(
            rng,
            (
                {"id": "raw"},
                {"id": "utf8"},
                {"id": "png"},
                {"id": "zstd"},
                {"id": "nope"},
                {"id": "pickle"},
                {},
                "raw",
                None,
                {"id": "png", "level": 99},
            ),
        )
        return {"field": f["name"], "codec": f["codec"]}
    if what == "name":  # a duplicate or invalid name (a valid new one is an alias)
        f["name"] = _pick(
            rng,
            (
                fields[(i + 1) % len(fields)]["name"],
                "",
                "a b",
                "1x",
                fields[0]["name"] + "__null",
                7,
            ),
        )
        return {"field": i, "name": f["name"]}
    if what == "drop":
        del fields[i]
        return {"drop": f["name"]}
    if what == "add":
        fields.insert(
            i,
            {
                "name": "extra",
                "dtype": "<i4",
                "shape": [],
                "codec": {"id": "raw"},
                "nullable": False,
            },
        )
        return {"add": i}
    key = _pick(rng, ("name", "dtype", "shape", "codec", "nullable"))
    f[key] = _odd_value(rng)
    return {"field": i, key: f[key]}


def _sealed_edit(kind: str, files: dict[str, bytes], rng, dmap: dict) -> dict | None:
    """One structure-aware edit of the manifest, pointer or sidecar, then :func:`reseal`."""
    from rowstore.codecs.blocks import compression_config

    m = json.loads(files[dmap["manifest"]])
    keep: set[str] = set()
    shards = m.get("shards") if isinstance(m.get("shards"), list) else []
    op: dict = {"op": kind}
    if kind in ("sealed-shard-int", "sealed-shard-path") and not all(
        isinstance(e, dict) for e in shards
    ):
        return None
    if kind == "sealed-shard-int":
        if not shards:
            return None
        s = int(rng.integers(len(shards)))
        key = _pick(
            rng,
            (
                "rows",
                "blocks",
                "rows_per_block",
                "heap_nbytes",
                "heap_chunks",
                "file_size",
                "rows",
                "blocks",
                "index_crc32",
            ),
        )
        v = shards[s].get(key)
        new = _odd_int(rng, v if isinstance(v, int) else 1)
        if key == "index_crc32":
            keep.add("index_crc32")
        shards[s][key] = new
        op.update(shard=s, key=key, value=new)
    elif kind == "sealed-shard-path":
        if not shards:
            return None
        s = int(rng.integers(len(shards)))
        other = shards[(s + 1) % len(shards)].get("path")
        p = shards[s].get("path")
        base = p.rsplit("/", 1)[-1] if isinstance(p, str) else "x.h5"
        how = _pick(
            rng,
            (
                "escape",
                "absolute",
                "duplicate",
                "other",
                "swap",
                "dotted",
                "empty-part",
                "backslash",
                "nul",
                "missing",
                "manifest",
                "pointer",
                "dir",
                "type",
                "dup-entry",
            ),
        )
        new: object = {
            # outside the case directory: the seed's own file next to it, by a relative and an
            # absolute path
            "escape": f"../{os.path.basename(dmap['root'])}/shards/{base}",
            "absolute": os.path.join(dmap["root"], "shards", base),
            "duplicate": other,
            "other": other,
            "dotted": f"./shards/{base}",
            "empty-part": f"shards//{base}",
            "backslash": f"shards\\{base}",
            "nul": f"shards/{base}\x00",
            "missing": "shards/nope.h5",
            "manifest": dmap["manifest"],
            "pointer": "rowstore.json",
            "dir": "shards",
            "type": _odd_value(rng),
        }.get(how)
        if how == "swap":
            shards[s]["path"], shards[(s + 1) % len(shards)]["path"] = other, p
        elif how == "dup-entry":  # the same shard twice, its index records twice too
            return _dup_entry(files, dmap, m, s, rng)
        elif how == "other":  # another shard's file under this entry, the other entry renamed away
            shards[s]["path"], shards[(s + 1) % len(shards)]["path"] = other, "shards/renamed.h5"
        else:
            shards[s]["path"] = new
        op.update(shard=s, how=how, path=shards[s].get("path"))
    elif kind in ("sealed-schema", "sealed-schema-alias"):
        if (
            not isinstance(m.get("schema"), dict)
            or not isinstance(m["schema"].get("fields"), list)
            or not m["schema"]["fields"]
        ):
            return None
        try:
            op.update(_schema_edit(rng, m["schema"], kind == "sealed-schema-alias"))
        except (KeyError, TypeError, IndexError, ValueError):
            return None
    elif kind == "sealed-compression":
        new = _pick(
            rng,
            (
                {"id": "none"},
                compression_config("lz4"),
                compression_config("zstd"),
                {"id": "blosc2", "cname": "zstd", "clevel": 5, "shuffle": "byte"},
                {"id": "blosc2", "cname": "lz4", "clevel": 1, "shuffle": "none"},
                {"id": "blosc2", "cname": "lz4", "clevel": 99, "shuffle": "byte"},
                {"id": "blosc2", "cname": "nope"},
                {"id": "gzip"},
                {"id": "none", "x": 1},
                {},
                "lz4",
                None,
                5,
            ),
        )
        m["compression"] = new
        op.update(value=new)
    elif kind == "sealed-header":
        key = _pick(
            rng,
            (
                "kind",
                "version",
                "format_version",
                "format",
                "heap_chunk_bytes",
                "index",
                "num_rows",
                "parent",
            ),
        )
        new = {
            "kind": _pick(rng, ("mixture", "", "SHARDS", None)),
            "version": _odd_int(rng, m.get("version", 2)),
            "format_version": _pick(rng, (0, 2, 99, -1, "1", 1.0, True)),
            "format": _pick(rng, ("rowstore", "", None)),
            "heap_chunk_bytes": _odd_int(rng, 256),
            "index": _pick(
                rng,
                (
                    {"path": "_manifests/v00000001.index"},
                    {"path": "../x.index", "nbytes": 8, "crc32": 0},
                    [],
                    "x",
                ),
            ),
            "num_rows": _odd_int(rng, 50),
            "parent": _odd_value(rng),
        }[key]
        if key == "index":
            keep.add("index")
            if isinstance(new, dict) and "nbytes" not in new and isinstance(m.get("index"), dict):
                new = {**m["index"], **new}  # the other version's sidecar, this one's size and CRC
        m[key] = new
        op.update(key=key, value=new)
    elif kind == "sealed-pointer":
        p = json.loads(files[dmap["pointer"]])
        key = _pick(rng, ("version", "format_version", "format", "manifest", "manifest_crc32"))
        v = p.get("version", 2)
        new = {
            "version": _pick(rng, (v + 1, 0, -1, 2**63, "2", True, None, 1.5)),
            "format_version": _pick(rng, (0, 2, "1", None)),
            "format": _pick(rng, ("rowstore", None, 1)),
            "manifest": _pick(
                rng,
                (
                    "_manifests/v00000001.json",
                    "../rowstore.json",
                    "/etc/passwd",
                    dmap["manifest"] + "\x00",
                    "_manifests/v2.json",
                    None,
                ),
            ),
            "manifest_crc32": _odd_int(rng, p.get("manifest_crc32", 0)),
        }[key]
        if key == "version" and new == 1:  # a consistent roll-back to version 1: not damage
            return None
        p[key] = new
        files[dmap["pointer"]] = json.dumps(p).encode()
        keep.add("pointer")
        op.update(key=key, value=new)
    elif kind == "sealed-delete-key":
        where = _pick(rng, ("top", "top", "shard", "index", "pointer"))
        if where == "top":
            key = _pick(rng, sorted(m))
            del m[key]
        elif where == "shard":
            if not shards or not isinstance(shards[0], dict):
                return None
            s = int(rng.integers(len(shards)))
            key = _pick(rng, sorted(shards[s]))
            del shards[s][key]
        elif where == "index":
            if not isinstance(m.get("index"), dict) or not m["index"]:
                return None
            key = _pick(rng, sorted(m["index"]))
            del m["index"][key]
            keep.add("index")
        else:
            p = json.loads(files[dmap["pointer"]])
            key = _pick(rng, sorted(p))
            del p[key]
            files[dmap["pointer"]] = json.dumps(p).encode()
            keep.add("pointer")
        op.update(where=where, key=key)
    elif kind == "sealed-type":
        where = _pick(rng, ("top", "shard", "shards"))
        if where == "top":
            key = _pick(rng, sorted(m))
            m[key] = _odd_value(rng)
            op.update(key=key, value=m[key])
        elif where == "shards":  # the list itself, or one entry, of the wrong type
            if shards and rng.random() < 0.5:
                shards[int(rng.integers(len(shards)))] = _odd_value(rng)
            else:
                m["shards"] = _pick(rng, ({}, "shards", None, 4, [[]]))
            op.update(where=where)
        else:
            if not shards:
                return None
            s = int(rng.integers(len(shards)))
            key = _pick(rng, sorted(shards[s]))
            shards[s][key] = _odd_value(rng)
            op.update(shard=s, key=key, value=shards[s][key])
    elif kind == "sealed-sidecar":
        return _sidecar_edit(files, dmap, m, rng)
    else:
        raise AssertionError(kind)
    files[dmap["manifest"]] = json.dumps(m, indent=1).encode()
    reseal(files, dmap, frozenset(keep))
    return op


def _dup_entry(files, dmap, m, s, rng) -> dict:
    """Shard ``s`` listed twice (entry and index records duplicated, counts consistent)."""
    blocks, heap = _sidecar_arrays(files[dmap["sidecar"]], m)
    shards = m["shards"]
    b0 = sum(e["blocks"] for e in shards[:s])
    h0 = sum(e["heap_chunks"] for e in shards[:s])
    e = shards[s]
    blocks = np.concatenate(
        [blocks[: b0 + e["blocks"]], blocks[b0 : b0 + e["blocks"]], blocks[b0 + e["blocks"] :]]
    )
    heap = np.concatenate(
        [
            heap[: h0 + e["heap_chunks"]],
            heap[h0 : h0 + e["heap_chunks"]],
            heap[h0 + e["heap_chunks"] :],
        ]
    )
    shards.insert(s + 1, dict(e))
    from rowstore.format import manifest as mf

    files[dmap["sidecar"]] = mf.INDEX_MAGIC + blocks.tobytes() + heap.tobytes()
    files[dmap["manifest"]] = json.dumps(m, indent=1).encode()
    reseal(files, dmap)
    return {"op": "sealed-shard-path", "shard": s, "how": "dup-entry"}


def _sidecar_edit(files, dmap, m, rng) -> dict | None:
    """One field of one block or heap chunk record of the sidecar set to an odd value."""
    from rowstore.format import manifest as mf

    try:
        blocks, heap = _sidecar_arrays(files[dmap["sidecar"]], m)
    except (KeyError, TypeError, ValueError):
        return None
    arr, what = (heap, "heap chunk") if len(heap) and rng.random() < 0.3 else (blocks, "block")
    if not len(arr):
        return None
    k = int(rng.integers(len(arr)))
    name = _pick(rng, arr.dtype.names)
    v = int(arr[name][k])
    other = int(arr[name][int(rng.integers(len(arr)))])
    new = [
        0,
        1,
        2**64 - 1,
        2**63,
        2**32,
        v + 1,
        v - 1,
        v + 8,
        v - 8,
        other,
        v + 4096,
        v ^ 1,
        v ^ (1 << 40),
        int(rng.integers(0, 1 << 16)),
    ][int(rng.integers(14))] % (1 << 64)
    if new == v:
        new = (v + 1) % (1 << 64)
    arr[name][k] = new
    op = {"op": "sealed-sidecar", "record": what, "index": k, "field": name, "old": v, "value": new}
    if (
        rng.random() < 0.25
    ):  # the owning shard's file_size inflated too: it bounds offsets and sizes
        counts = np.cumsum(
            [e["heap_chunks" if what == "heap chunk" else "blocks"] for e in m["shards"]]
        )
        s = int(np.searchsorted(counts, k, side="right"))
        m["shards"][s]["file_size"] = 1 << 62
        op["file_size"] = {"shard": s, "value": 1 << 62}
    files[dmap["sidecar"]] = mf.INDEX_MAGIC + blocks.tobytes() + heap.tobytes()
    files[dmap["manifest"]] = json.dumps(m, indent=1).encode()
    reseal(files, dmap)
    return op


def mutate_dataset(kind: str, files: dict[str, bytes], rng, dmap: dict) -> dict | None:
    """Apply one mutation of ``kind`` to a dataset held as ``files`` (in place); the op or None."""
    if kind in DS_BYTE_KINDS:
        target, how = kind.split("-", 1)
        rel = dmap[target]
        data = bytearray(files[rel])
        n = len(data)
        if n == 0 and how != "extend":  # an earlier op of the case truncated it to nothing
            return None
        if how == "truncate":
            p = int(rng.integers(0, n))
            files[rel] = bytes(data[:p])
            op = {"op": "truncate", "at": p}
        elif how == "extend":
            g = rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8).tobytes()
            if rng.random() < 0.3:
                g = b" \n"[
                    : int(rng.integers(1, 3))
                ]  # JSON-neutral bytes: still the CRC's to refuse
            files[rel] = bytes(data) + g
            op = {"op": "extend", "n": len(g)}
        else:
            op = {"bitflip": _flip, "setbyte": _set, "zero": _zero}[how](data, rng, 0, n)
            files[rel] = bytes(data)
        op["file"] = rel
        return op
    if kind in SEALED_KINDS or kind in ALIAS_KINDS:
        try:
            return _sealed_edit(kind, files, rng, dmap)
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
        ):  # an earlier op left JSON this edit cannot walk
            return None
    if kind in DS_SHARD_KINDS:
        e = dmap["shards"][int(rng.integers(len(dmap["shards"])))]
        data = bytearray(files[e["path"]])
        data, op = mutate(kind[len("shard-") :], data, rng, dmap["smaps"][e["path"]])
        if op is not None:
            files[e["path"]] = bytes(data)
            op["file"] = e["path"]
        return op
    raise AssertionError(kind)


# --------------------------------------------------------------------------- oracle (child)


def _canon(v):
    if v is None:
        return None
    if isinstance(v, (str, bytes)):
        return v
    a = np.asarray(v)
    if a.dtype == object:
        return a.item() if a.ndim == 0 else tuple(_canon(x) for x in a.reshape(-1))
    return (a.dtype.str, a.shape, a.tobytes())


def _field(d: dict, k: str):
    if k not in d:  # the file's schema names other fields (a renamed field): not what was written
        raise _Wrong(f"field {k!r} missing from what was read (keys {sorted(d)[:8]})")
    return d[k]


def _canon_row(row: dict, names) -> tuple:
    return tuple(_canon(_field(row, k)) for k in names)


def _batch_rows(batch: dict, names, nullable) -> list[tuple]:
    n = len(_field(batch, names[0]))
    rows = []
    for i in range(n):
        vals = []
        for k in names:
            if k in nullable and _field(batch, k + "__null")[i]:
                vals.append(None)
            else:
                vals.append(_canon(_field(batch, k)[i]))
        rows.append(tuple(vals))
    return rows


class _Wrong(Exception):
    pass


def _check_rows(got: list[tuple], expected: list[tuple], ordered: bool, what: str):
    if ordered:
        if got != expected:
            bad = next(
                (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
                min(len(got), len(expected)),
            )
            raise _Wrong(f"{what}: row {bad} differs ({len(got)} rows read)")
        return
    if sorted(got, key=repr) != sorted(expected, key=repr):
        raise _Wrong(f"{what}: the rows read ({len(got)}) are not the rows written")


def _steps(path: str, expected: list[tuple], names, nullable):
    """Yields (step name, callable); each callable returns normally, raises _Wrong or any error."""
    import rowstore
    from rowstore.cli import main as cli_main

    state = {}

    # A dataset's schema is its manifest's: a sealed edit of it is wrong data only once a read
    # returns values under it (the reads may refuse the edited layout); a file's is checked at open.
    dataset = os.path.isdir(path)

    def fields(what):
        if [f.name for f in state["r"].schema] != list(names):
            raise _Wrong(
                f"{what}: fields {[f.name for f in state['r'].schema]}, {list(names)} written"
            )

    def op():
        state["r"] = rowstore.open(path)
        if len(state["r"]) != len(expected):
            raise _Wrong(f"open: {len(state['r'])} rows, {len(expected)} written")
        if not dataset:
            fields("open")

    def first():
        row = state["r"][0]
        fields("r[0]")
        _check_rows([_canon_row(row, names)], expected[:1], True, "r[0]")

    def take():
        t = state["r"].take(np.arange(len(expected)), varlen="ragged")
        fields("take")
        _check_rows(_batch_rows(t, names, nullable), expected, True, "take")

    def batches(shuffle):
        def go():
            got = []
            for b in state["r"].batches(7, shuffle=shuffle, num_threads=2, varlen="ragged"):
                got += _batch_rows(b, names, nullable)
            fields(f"batches({shuffle})")
            _check_rows(got, expected, shuffle == "none", f"batches({shuffle})")

        return go

    def verify():
        state["r"].layout.verify()

    def cli():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = cli_main(
                ["verify", path, "--no-hdf5-check"]
            )  # the cross-check runs libhdf5 in a child of its own
        if rc != 0:
            raise rowstore.RowstoreError(f"rowstore verify exited {rc}")

    yield "open", op
    yield "r[0]", first
    yield "take", take
    for s in ("block", "full", "none"):
        yield f"batches-{s}", batches(s)

    def damage():
        found = state["r"].layout.damage()
        if found:
            raise found[0]

    yield "verify", verify
    if os.path.isdir(path):  # a dataset: every damaged chunk of every shard, not just the first
        yield "damage", damage
    yield "cli-verify", cli
    if "r" in state:
        with contextlib.suppress(Exception):
            state["r"].close()


def run_oracle(path: str, with_image: bool, progress=None) -> dict:
    """Every step on ``path``; ``progress(step)`` is called before each (the parent names the
    step a hang or crash happened in)."""
    from rowstore import RowstoreError

    schema = seed_schema(with_image)
    names = [f.name for f in schema]
    nullable = {f.name for f in schema if f.nullable}
    expected = [_canon_row(r, names) for r in seed_rows(with_image)]
    outcome, detail = "ok", []
    gen = _steps(path, expected, names, nullable)
    for name, fn in gen:
        if progress is not None:
            progress(name)
        try:
            fn()
            continue
        except _Wrong as exc:
            res, info = "WRONG-DATA", {"step": name, "message": str(exc)}
        except RowstoreError as exc:
            res, info = "rowstore-error", {"step": name, "type": type(exc).__name__}
        except OSError as exc:
            if exc.errno is not None:
                res, info = (
                    "rowstore-error",
                    {"step": name, "type": type(exc).__name__, "errno": exc.errno},
                )
            else:
                res, info = "LEAKED", _leak(name, exc)
        except BaseException as exc:  # noqa: BLE001 - the oracle classifies everything
            res, info = "LEAKED", _leak(name, exc)
        if SEVERITY[res] > SEVERITY[outcome]:
            outcome = res
        detail.append({"outcome": res, **info})
        if name == "open":
            gen.close()
            break
    return {"outcome": outcome, "steps": detail}


def _leak(step, exc):
    tb = traceback.extract_tb(exc.__traceback__)
    last = tb[-1] if tb else None
    return {
        "step": step,
        "type": type(exc).__name__,
        "message": str(exc)[:300],
        "where": f"{last.filename}:{last.lineno} in {last.name}" if last else None,
    }


def child_main(conn, mem_limit: int, target: str | None = None):
    """Runs cases sent by :class:`Child`; ``target`` ("module:function", same signature as
    :func:`run_oracle`) replaces the oracle (``tools/robustness/fuzz_atheris.py`` replays with its
    own)."""
    import importlib
    import resource

    if mem_limit:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    import faulthandler

    faulthandler.disable()
    import rowstore  # noqa: F401 - import once, before the first case

    oracle = run_oracle
    if target is not None:
        mod, _, fn = target.partition(":")
        oracle = getattr(importlib.import_module(mod), fn)
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        cid, path, with_image = msg
        conn.send(("start", cid))
        try:
            res = oracle(path, with_image, lambda step: conn.send(("step", step)))
        except BaseException as exc:  # noqa: BLE001
            res = {"outcome": "LEAKED", "steps": [_leak("oracle", exc)]}
        conn.send(("done", (cid, res)))


class Child:
    def __init__(self, mem_limit: int, target: str | None = None):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(
            target=child_main, args=(child_conn, mem_limit, target), daemon=True
        )
        self.proc.start()
        child_conn.close()
        if not self.conn.poll(120):
            raise RuntimeError("fuzz child did not start")
        self.conn.recv()
        self.cases = 0

    def run(self, cid, path, with_image, timeout):
        """(result, alive)"""
        self.conn.send((cid, path, with_image))
        self.cases += 1
        deadline = time.monotonic() + timeout
        started = False
        step = None
        while True:
            left = deadline - time.monotonic()
            try:
                ready = self.conn.poll(max(0.0, min(left, 0.2)))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    kind, val = self.conn.recv()
                except (EOFError, OSError):
                    ready = False
                else:
                    if kind == "start":
                        started = True
                        deadline = time.monotonic() + timeout
                        continue
                    if kind == "step":
                        step = val
                        continue
                    return val[1], True
            if not self.proc.is_alive():
                self.proc.join()
                code = self.proc.exitcode
                sig = -code if code is not None and code < 0 else None
                return {
                    "outcome": "CRASH",
                    "steps": [{"step": step, "signal": sig, "exitcode": code, "started": started}],
                }, False
            if time.monotonic() > deadline:
                self.kill()
                return {"outcome": "HANG", "steps": [{"step": step, "timeout_s": timeout}]}, False

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()

    def close(self):
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.proc.join(5)
        self.kill()


# --------------------------------------------------------------------------- driver


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, help="run for this long")
    ap.add_argument("--cases", type=int, help="run this many cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--region", choices=sorted(KINDS), default="all")
    ap.add_argument("--out", default="bench/results/fuzz.json")
    ap.add_argument("--cases-dir", default="bench/results/fuzz-cases")
    ap.add_argument(
        "--timeout", type=float, default=10.0, help="seconds per case before it is a HANG"
    )
    ap.add_argument("--per-child", type=int, default=50, help="cases per child process")
    ap.add_argument("--mem-gib", type=float, default=4.0, help="RLIMIT_AS of the child")
    ap.add_argument("--no-image", action="store_true", help="leave the PNG field out")
    ap.add_argument(
        "--format",
        choices=("v1", "v2"),
        default="v2",
        help="seed files as written (v2, with a footer) or as the v1 writer left them",
    )
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--replay",
        nargs="+",
        metavar="FILE",
        help="run the oracle on these files (.h5 or .h5.gz) or dataset directories and print the "
        "outcomes",
    )
    args = ap.parse_args(argv)
    if args.replay:
        return replay(args)
    if args.minutes is None and args.cases is None:
        ap.error("give --minutes or --cases")
    with_image = _has_imagecodecs() and not args.no_image
    kinds = KINDS[args.region]
    dataset = args.region in DATASET_KINDS  # the targets are dataset directories, not files
    rng = np.random.default_rng(args.seed)
    tmp = tempfile.mkdtemp(prefix="rowstore-fuzz-")
    t0 = time.monotonic()
    try:
        if dataset:
            seeds = build_dataset_seeds(tmp, with_image)
            blobs = {k: read_tree(p) for k, p in seeds.items()}
            smaps = {k: dataset_map(p) for k, p in seeds.items()}
        else:
            seeds = build_seeds(tmp, with_image)
            if args.format == "v1":
                for p in seeds.values():
                    as_v1(p)
            blobs = {k: bytes(open(p, "rb").read()) for k, p in seeds.items()}
            smaps = {k: structure_map(p) for k, p in seeds.items()}
        mem = int(args.mem_gib * 2**30)
        child = Child(mem)
        for name, p in seeds.items():  # sanity: the unmutated seeds read back exactly
            res, _ = child.run(name, p, with_image, args.timeout)
            if res["outcome"] != "ok":
                raise SystemExit(f"seed {name} does not read back as written: {res}")
        by_outcome = collections.Counter()
        by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        findings = []
        error_types = collections.Counter()
        case_path = os.path.join(
            tmp, "case-ds" if dataset else "case.h5"
        )  # next to the seeds (escaping paths)
        deadline = t0 + 60 * args.minutes if args.minutes is not None else None
        i = 0
        while True:
            if args.cases is not None and i >= args.cases:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            seed_name = list(seeds)[int(rng.integers(len(seeds)))]
            ops = []
            case_kinds = []
            if dataset:
                files = dict(blobs[seed_name])
                for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
                    kind = kinds[int(rng.integers(len(kinds)))]
                    op = mutate_dataset(kind, files, rng, smaps[seed_name])
                    if op is not None:
                        op["kind"] = kind
                        ops.append(op)
                        case_kinds.append(kind)
                if not ops or files == blobs[seed_name]:
                    continue
                write_tree(case_path, files)
            else:
                data = bytearray(blobs[seed_name])
                for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
                    kind = kinds[int(rng.integers(len(kinds)))]
                    data, op = mutate(kind, data, rng, smaps[seed_name])
                    if op is not None:
                        op["kind"] = kind
                        ops.append(op)
                        case_kinds.append(kind)
                    if kind.startswith(("truncate", "insert", "footer-sealed")):
                        break  # later offsets would no longer mean the seed's structures
                if not ops or data == blobs[seed_name]:
                    continue  # nothing applied, or a no-op (zeros over zeros)
                with open(case_path, "wb") as fh:
                    fh.write(data)
            if child.cases >= args.per_child:
                child.close()
                child = Child(mem)
            res, alive = child.run(i, case_path, with_image, args.timeout)
            if not alive:
                child = Child(mem)
            out = res["outcome"]
            by_outcome[out] += 1
            if res["steps"]:
                first = res["steps"][0]
                error_types[
                    f"{first.get('outcome', out)}: {first.get('type', first.get('signal', '-'))} "
                    f"at {first.get('step', '-')}"
                ] += 1
            label = "+".join(sorted(set(case_kinds)))
            by_kind[label if len(set(case_kinds)) == 1 else "multi"][out] += 1
            if out in BAD:
                os.makedirs(args.cases_dir, exist_ok=True)
                if dataset:  # the case directory, as it was read
                    h = tree_digest(files)
                    rec = {
                        "case": i,
                        "seed_file": seed_name,
                        "outcome": out,
                        "kinds": case_kinds,
                        "ops": ops,
                        "steps": res["steps"],
                        "file": f"{out}-{h}",
                        "nbytes": sum(map(len, files.values())),
                    }
                    shutil.rmtree(os.path.join(args.cases_dir, rec["file"]), ignore_errors=True)
                    shutil.copytree(case_path, os.path.join(args.cases_dir, rec["file"]))
                    stem = rec["file"]
                else:
                    h = hashlib.sha1(bytes(data)).hexdigest()[:10]
                    rec = {
                        "case": i,
                        "seed_file": seed_name,
                        "outcome": out,
                        "kinds": case_kinds,
                        "ops": ops,
                        "steps": res["steps"],
                        "file": f"{out}-{h}.h5",
                        "nbytes": len(data),
                        "crc32": zlib.crc32(data),
                    }
                    shutil.copyfile(case_path, os.path.join(args.cases_dir, rec["file"]))
                    stem = rec["file"][:-3]
                findings.append(rec)
                with open(os.path.join(args.cases_dir, stem + ".json"), "w") as fh:
                    json.dump(rec, fh, indent=1, default=repr)
                if not args.quiet:
                    print(f"case {i}: {out} {label} {res['steps']}", file=sys.stderr)
            i += 1
        child.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    report = {
        "seed": args.seed,
        "region": args.region,
        "format": args.format if not dataset else None,
        "cases": i,
        "seconds": round(elapsed, 1),
        "with_image": with_image,
        "seed_files": {
            k: sum(map(len, v.values())) if dataset else len(v) for k, v in blobs.items()
        },
        "by_outcome": {o: by_outcome[o] for o in OUTCOMES},
        "by_kind": {k: {o: c[o] for o in OUTCOMES if c[o]} for k, c in sorted(by_kind.items())},
        "first_error": dict(error_types.most_common()),
        "findings": findings,
    }
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1, default=repr)
    print_table(report)
    return 0


def replay(args) -> int:
    """The oracle on saved reproducers (``tests/data/fuzz``, ``bench/results/fuzz-cases``)."""
    import gzip

    with_image = _has_imagecodecs() and not args.no_image
    tmp = tempfile.mkdtemp(prefix="rowstore-fuzz-")
    child = Child(int(args.mem_gib * 2**30))
    try:
        for src in args.replay:
            path = src
            if src.endswith(".gz"):
                path = os.path.join(tmp, "replay.h5")
                with gzip.open(src, "rb") as fi, open(path, "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            res, alive = child.run(src, path, with_image, args.timeout)
            print(json.dumps({"file": src, **res}))
            if not alive:
                child = Child(int(args.mem_gib * 2**30))
    finally:
        child.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def print_table(report):
    cols = OUTCOMES
    print(
        f"{report['cases']} cases in {report['seconds']} s (region {report['region']}, seed "
        f"{report['seed']})"
    )
    print("| kind | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for k, c in report["by_kind"].items():
        print(f"| {k} | " + " | ".join(str(c.get(o, 0)) for o in cols) + " |")
    print("| **total** | " + " | ".join(str(report["by_outcome"][o]) for o in cols) + " |")


if __name__ == "__main__":
    sys.exit(main())
