"""``rowstore verify``'s cross-check of a v2 file: does its HDF5 part (what h5py, h5dump and a v1
reader see) hold the same attributes and index as its footer (what rowstore reads)?

libhdf5 parses the HDF5 metadata in a child process with a timeout, so that damaged metadata that
makes it hang or crash cannot hang or crash ``verify``. Run as ``python -m
rowstore.format._hdf5_check PATH``, the child prints one JSON line: the attributes and the CRC-32
of the block and heap chunk index datasets (:func:`rowstore.format.manifest.index_crc32`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from rowstore.errors import FormatError
from rowstore.format import spec

__all__ = ["hdf5_disagreement", "shard_index"]

#: Attributes compared (the footer's header holds the same values).
_ATTRS = (
    spec.ATTR_FORMAT,
    spec.ATTR_VERSION,
    spec.ATTR_SCHEMA,
    spec.ATTR_USER,
    spec.ATTR_NUM_ROWS,
    spec.ATTR_ROWS_PER_BLOCK,
    spec.ATTR_HEAP_CHUNK_BYTES,
    spec.ATTR_HEAP_NBYTES,
    spec.ATTR_COMPRESSION,
    spec.ATTR_CHECKSUM,
    spec.ATTR_HAS_FOOTER,
)


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return (
        v.item()
        if hasattr(v, "item") and getattr(v, "ndim", 0) == 0
        else str(v)
        if hasattr(v, "ndim")
        else v
    )


def _child(path: str) -> dict:
    import h5py
    import numpy as np

    from rowstore.format.manifest import index_crc32

    with h5py.File(path, "r") as f:
        if spec.GROUP not in f:
            return {"attrs": {}, "index_crc32": None, "rows": None}
        g = f[spec.GROUP]
        attrs = {k: _plain(g.attrs[k]) for k in _ATTRS if k in g.attrs}
        blocks = (
            np.asarray(g[spec.BLOCKS][()]) if spec.BLOCKS in g else np.zeros(0, spec.BLOCK_DTYPE)
        )
        chunks = (
            np.asarray(g[spec.HEAP_CHUNKS][()])
            if spec.HEAP_CHUNKS in g
            else np.zeros(0, spec.HEAP_CHUNK_DTYPE)
        )
        rows = g[spec.ROWS].shape[0] if spec.ROWS in g else None
    return {"attrs": attrs, "index_crc32": index_crc32(blocks, chunks), "rows": rows}


def _run_child(path: str, timeout: float) -> tuple[dict | None, str | None]:
    """``(what the child printed, None)``, or ``(None, why libhdf5 gave no answer)``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rowstore.format._hdf5_check", path],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return (
            None,
            f"libhdf5 did not finish reading the HDF5 part within {timeout:g} s (damaged HDF5 "
            f"metadata?)",
        )
    if proc.returncode != 0:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else "failed"
        last = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        return None, f"libhdf5 {how} reading the HDF5 part (h5py and h5dump cannot read it): {last}"
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, "the HDF5 check printed no result"


def hdf5_disagreement(layout: Any, *, timeout: float = 60.0) -> str | None:
    """None if the HDF5 part of the v2 file ``layout`` describes (a
    :class:`~rowstore.format.index.Layout` read from its footer) holds the same attributes and
    index as the footer; else what differs, or why libhdf5 could not say (an error, a crash, or
    no answer within ``timeout`` seconds)."""
    from rowstore.format import footer, manifest

    got, why = _run_child(layout.path, timeout)
    if got is None:
        return why
    with open(layout.path, "rb") as f:
        ft = footer.read_local(f.fileno(), os.fstat(f.fileno()).st_size, layout.path)
    if ft is None:
        return "the file has no footer"
    want = {k: v for k, v in ft.header.items() if k in _ATTRS}
    diff = sorted(k for k in set(want) | set(got["attrs"]) if want.get(k) != got["attrs"].get(k))
    if diff:
        return f"the HDF5 attributes {', '.join(diff)} differ from the footer's"
    if got["index_crc32"] != manifest.index_crc32(layout.blocks, layout.heap_chunks):
        return "the HDF5 block or heap chunk index differs from the footer's"
    if got["rows"] != layout.num_rows:
        return f"the HDF5 row table has {got['rows']} rows, the footer {layout.num_rows}"
    return None


def shard_index(
    path: str, *, timeout: float = 60.0
) -> tuple[int, int | None, str | None] | FormatError:
    """``(index CRC-32, rows, schema JSON text)`` of the file at ``path`` as its own metadata
    records them (:func:`rowstore.format.manifest.index_crc32`), for comparing a dataset
    shard with its manifest: a v2 file's from its footer, in this process (no libhdf5); a file
    without a footer's from its HDF5 part, parsed by libhdf5 in a child process given
    ``timeout`` seconds (damaged metadata can make libhdf5 hang or crash). Else the
    :class:`FormatError` saying why it cannot be read."""
    from rowstore.format import footer, manifest
    from rowstore.format.index import Layout
    from rowstore.storage.local import file_identity, open_regular

    try:
        fd, st = open_regular(path)
        try:
            ft = footer.read_local(fd, st.st_size, path)
        finally:
            os.close(fd)
        if ft is not None:
            L = Layout.from_footer(ft, path, st.st_size, file_identity(st))
            return manifest.index_crc32(L.blocks, L.heap_chunks), L.num_rows, L.schema.to_json_str()
    except FormatError as exc:
        return exc
    except OSError as exc:
        return FormatError(f"{path!r} cannot be read: {exc}", path=path)
    got, why = _run_child(path, timeout)
    if got is None:
        return FormatError(f"{path!r}: {why}", path=path)
    a = got["attrs"]
    if a.get(spec.ATTR_FORMAT) != spec.FORMAT_NAME:
        return FormatError(
            f"{path!r}: not a rowstore file (no /rowstore group with format='rowstore')", path=path
        )
    if a.get(spec.ATTR_HAS_FOOTER) or (
        isinstance(a.get(spec.ATTR_VERSION), int) and a[spec.ATTR_VERSION] >= 2
    ):
        return FormatError(
            f"{path!r}: its attributes say it had a checksummed v2 footer, which is gone (opened "
            f"for "
            f"writing with h5py or another HDF5 tool, or truncated where the footer starts)",
            path=path,
        )
    return got["index_crc32"], got["rows"], a.get(spec.ATTR_SCHEMA)


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])))
