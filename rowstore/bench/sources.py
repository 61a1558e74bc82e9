"""What is measured: rowstore (numpy, torch, tf) and the loaders a user would write by hand.

Each source turns ``(path, options)`` into epochs of batches: dicts of per-field arrays with a
leading batch dimension, the same shape of output rowstore gives (fixed fields as contiguous
arrays, images decoded, variable-shape values as lists of arrays, ``str``/``bytes`` as object
arrays), so that :func:`rowstore.bench.measure.touch` counts the same decoded bytes for all.

The baselines read the same rowstore file (it is ordinary HDF5: ``/rowstore/rows`` is a compound
table, ``/rowstore/heap`` a ``uint8`` array of payloads), or ``.npy`` files exported from it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rowstore.bench import adapters
from rowstore.bench._source import MODES, Source, uniform_order, var_dims_of
from rowstore.errors import RowstoreError
from rowstore.format import spec
from rowstore.format.index import Layout, open_h5
from rowstore.format.shards import DatasetLayout
from rowstore.reader import order as _order
from rowstore.schema import BYTES, STR, Field

__all__ = [
    "BASELINES",
    "MODES",
    "Source",
    "open_source",
    "describe",
    "export_npy",
    "uniform_order",
    "var_dims_of",
]

#: Baselines: key -> (short label, what it does).
BASELINES = {
    "h5py-row": (
        "h5py per-row",
        "h5py ds[i] per row of a uniform shuffle on /rowstore/rows; heap fields: heap[off:off+n] "
        "per "
        "row and value (PNG/JPEG decoded with imagecodecs). A fixed number of rows is timed and "
        "rows/s "
        "extrapolated to the epoch.",
    ),
    "h5py-fancy": (
        "h5py sorted fancy",
        "h5py ds[np.sort(idx)] per batch of a uniform shuffle; heap fields: heap[off:off+n] per "
        "row and "
        "value, images decoded with imagecodecs.",
    ),
    "tables-coords": (
        "PyTables coords",
        "PyTables table.read_coordinates(np.sort(idx)) per batch of a uniform shuffle; heap "
        "fields: "
        "heap[off:off+n] per row and value, images decoded with imagecodecs.",
    ),
    "tables-block": (
        "PyTables block+gather",
        "PyTables table.read(start, stop) per block of a window of W shuffled blocks, "
        "np.concatenate, "
        "then a numpy gather of the window's shuffled rows (rowstore's block order, so the same "
        "shuffle "
        "quality); heap fields: the block's heap range read in one heap[lo:hi], sliced per value.",
    ),
    "memmap": (
        "numpy memmap gather",
        "numpy np.load(<field>.npy, mmap_mode='r')[idx] per field per batch of a uniform shuffle, "
        "from "
        "one .npy per fixed field exported beforehand; heap fields: a flat payload .npy + offsets "
        ".npy, "
        "np.array(payload[a:b]) per value, images decoded with imagecodecs.",
    ),
}


def describe(kind: str, mode: str = "numpy") -> tuple[str, str]:
    """(short label, description) of a source kind."""
    if kind == "rowstore":
        return f"rowstore {mode}", MODES[mode]
    return BASELINES[kind]


# -- heap decoding shared by the baselines -----------------------------------------------------
def _image_decoder(f: Field) -> Callable:
    import imagecodecs

    return imagecodecs.png_decode if f.codec["id"] == "png" else imagecodecs.jpeg8_decode


def decode_heap_field(
    f: Field,
    offs: np.ndarray,
    nbs: np.ndarray,
    shapes: np.ndarray | None,
    nulls: np.ndarray | None,
    get: Callable[[int, int], Any],
) -> Any:
    """Decode one heap field of a batch the way user code would: fetch each value's bytes with
    ``get(offset, nbytes)`` and decode them (imagecodecs for images, ``np.frombuffer`` for raw
    variable-shape arrays, UTF-8 for text). Returns an array (fixed-shape images), a list of
    arrays (variable shapes) or an object array (str/bytes), like rowstore's reader."""
    n = len(offs)
    isnull = nulls if nulls is not None else np.zeros(n, np.bool_)
    if f.dtype in (STR, BYTES):
        vals = np.empty(n, object)
        for i in range(n):
            if isnull[i]:
                vals[i] = None
                continue
            b = bytes(get(int(offs[i]), int(nbs[i])))
            vals[i] = b.decode("utf-8") if f.dtype == STR else b
        return vals
    var_dims = list(f.variable_dims)

    def shape_of(i: int) -> tuple[int, ...]:
        s = list(f.shape)
        for k, d in enumerate(var_dims):
            assert shapes is not None  # the caller passes shapes for variable dims
            s[d] = int(shapes[i][k])
        return tuple(s)

    if f.codec["id"] in ("png", "jpeg"):
        dec = _image_decoder(f)
        if not f.is_variable:
            dst = np.zeros((n,) + tuple(f.shape), f.dtype)
            for i in range(n):
                if not isnull[i]:
                    img = dec(get(int(offs[i]), int(nbs[i])))
                    dst[i] = img.reshape(f.shape)
            return dst
        out = []
        for i in range(n):
            out.append(
                np.zeros(0, f.dtype)
                if isnull[i]
                else dec(get(int(offs[i]), int(nbs[i]))).reshape(shape_of(i))
            )
        return out
    out = []
    for i in range(n):
        if isnull[i]:
            out.append(np.zeros(0, f.dtype))
        else:
            out.append(
                np.frombuffer(get(int(offs[i]), int(nbs[i])), dtype=f.dtype).reshape(shape_of(i))
            )
    return out


def _split_records(
    rec: np.ndarray,
    fields: Sequence[Field],
    get: Callable[[int, int], Any] | None,
    shift: np.ndarray | None = None,
) -> dict:
    """Structured rows (``/rowstore/rows`` records) -> per-field batch dict; heap values through
    ``get(offset, nbytes)`` built by the caller, the offsets first moved by ``shift`` (per row)
    when the caller's heap buffer does not start at logical offset 0."""
    out: dict[str, Any] = {}
    for f in fields:
        nulls = None
        if f.nullable:
            nulls = rec[f.name + spec.NULL_SUFFIX].astype(np.bool_)
            out[f.name + spec.NULL_SUFFIX] = nulls
        if f.inline:
            out[f.name] = np.ascontiguousarray(rec[f.name])
        else:
            ref = rec[f.name]
            assert get is not None  # the caller passes get when there are heap fields
            shapes = ref["shape"] if f.variable_dims else None
            offs = ref["offset"] if shift is None else ref["offset"].astype(np.int64) + shift
            out[f.name] = decode_heap_field(f, offs, ref["nbytes"], shapes, nulls, get)
    return out


def _batches_of(order: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for a in range(0, len(order), batch_size):
        yield order[a : a + batch_size]


# -- the baselines -------------------------------------------------------------------------------
class _H5:
    """The file through h5py (hdf5plugin registered, so compressed files read too)."""

    def __init__(self, path: str):
        self.f = open_h5(path)
        g = self.f[spec.GROUP]
        self.rows = g[spec.ROWS]
        self.heap: Any = g[spec.HEAP] if spec.HEAP in g else None  # h5py.Dataset (unless no heap)

    def get(self, off: int, nb: int) -> np.ndarray:
        return self.heap[off : off + nb]

    def close(self) -> None:
        self.f.close()


def _h5py_row(layout: Layout, fields: list[Field], opts: dict) -> tuple[Callable, Callable]:
    h5 = _H5(layout.path)
    dt = layout.row_dtype

    def epoch(k: int) -> Iterator[dict]:
        for idx in _batches_of(uniform_order(layout.num_rows, opts["seed"], k), opts["batch_size"]):
            rec = np.empty(len(idx), dt)
            for j, i in enumerate(idx):
                rec[j] = h5.rows[int(i)]
            yield _split_records(rec, fields, h5.get)

    return epoch, h5.close


def _h5py_fancy(layout: Layout, fields: list[Field], opts: dict) -> tuple[Callable, Callable]:
    h5 = _H5(layout.path)

    def epoch(k: int) -> Iterator[dict]:
        for idx in _batches_of(uniform_order(layout.num_rows, opts["seed"], k), opts["batch_size"]):
            rec = h5.rows[np.sort(idx)]
            yield _split_records(rec, fields, h5.get)

    return epoch, h5.close


def _open_tables(path: str):
    import warnings

    import hdf5plugin  # noqa: F401 - Blosc2 for compressed files
    import tables

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = tables.open_file(path, "r")
    g = f.get_node("/" + spec.GROUP)
    heap = g._f_get_child(spec.HEAP) if spec.HEAP in g else None
    return f, g._f_get_child(spec.ROWS), heap


def _tables_coords(layout: Layout, fields: list[Field], opts: dict) -> tuple[Callable, Callable]:
    f, table, heap = _open_tables(layout.path)

    def get(off: int, nb: int):
        return heap[off : off + nb]

    def epoch(k: int) -> Iterator[dict]:
        for idx in _batches_of(uniform_order(layout.num_rows, opts["seed"], k), opts["batch_size"]):
            rec = table.read_coordinates(np.sort(idx))
            yield _split_records(rec, fields, get)

    return epoch, f.close


def _block_segments(layout: Layout, opts: dict, k: int):
    return _order.iter_segments(
        layout.block_rows(),
        layout.rows_per_block,
        shuffle="block",
        seed=opts["seed"],
        epoch=k,
        window=_baseline_window(opts),
        rank=0,
        world=1,
    )


def _baseline_window(opts: dict) -> int:
    """The block baseline's window of whole blocks (it reads blocks whole: no pieces)."""
    return opts.get("window") or _order.WINDOW_BLOCKS


def _join(parts: list[dict]) -> dict:
    """Concatenate batch dicts (arrays, object arrays or lists per key)."""
    if len(parts) == 1:
        return parts[0]
    return {
        k: (
            sum((p[k] for p in parts), [])
            if isinstance(v, list)
            else np.concatenate([p[k] for p in parts])
        )
        for k, v in parts[0].items()
    }


def _tables_block(layout: Layout, fields: list[Field], opts: dict) -> tuple[Callable, Callable]:
    f, table, heap = _open_tables(layout.path)
    rpb, n_rows = layout.rows_per_block, layout.num_rows
    heap_fields = [fl for fl in fields if not fl.inline]
    B = opts["batch_size"]

    def window(seg) -> tuple[int, Callable[[int, int], dict]]:
        """Read the window's blocks (and their heap ranges), gather its rows in shuffled order;
        return the row count and a function decoding rows a:b of it (decoding per batch)."""
        parts, hparts, hbase = [], [], []
        hpos = 0
        for b in seg.blocks:
            rec = table.read(int(b) * rpb, min((int(b) + 1) * rpb, n_rows))
            parts.append(rec)
            if heap_fields:  # the block's payloads are contiguous in the heap: one read
                lo = min(int(rec[fl.name]["offset"].min()) for fl in heap_fields)
                hi = max(
                    int((rec[fl.name]["offset"] + rec[fl.name]["nbytes"]).max())
                    for fl in heap_fields
                )
                hparts.append(heap[lo:hi] if hi > lo else np.zeros(0, np.uint8))
                hbase.append(np.full(len(rec), hpos - lo, np.int64))
                hpos += hi - lo
        win = np.concatenate(parts)
        slot = np.empty(layout.num_blocks, np.int64)
        slot[seg.blocks] = np.arange(len(seg.blocks)) * rpb
        rows = seg.rows()
        pos = slot[rows // rpb] + rows % rpb
        wrec = win[pos]  # the window's rows in shuffled order
        wheap = np.concatenate(hparts) if heap_fields else None
        base = np.concatenate(hbase)[pos] if heap_fields else None

        def decode(a: int, b: int) -> dict:
            if not heap_fields:
                return _split_records(wrec[a:b], fields, None)
            assert wheap is not None and base is not None  # set above when there are heap fields
            return _split_records(
                wrec[a:b], fields, lambda off, nb: wheap[off : off + nb], base[a:b]
            )

        return len(wrec), decode

    def epoch(k: int) -> Iterator[dict]:
        pieces: list[tuple[Callable, int, int]] = []
        have = 0
        for seg in _block_segments(layout, opts, k):
            n, decode = window(seg)
            pos = 0
            while pos < n:
                take = min(B - have, n - pos)
                pieces.append((decode, pos, pos + take))
                have += take
                pos += take
                if have == B:
                    yield _join([d(a, b) for d, a, b in pieces])
                    pieces, have = [], 0
        if have:
            yield _join([d(a, b) for d, a, b in pieces])

    return epoch, f.close


# -- numpy memmap ------------------------------------------------------------------------------
#: The file that marks a finished .npy export (and records what it exported).
NPY_DONE = "export.json"


def export_npy(path: str, out_dir: str, *, fields: Sequence[str] | None = None) -> str:
    """Export a rowstore file to ``.npy`` files for the memmap baseline (skipped when ``out_dir``
    already holds an export of the same file: size, mtime and fields recorded in
    ``export.json``).

    Fixed fields: ``<name>.npy`` of shape ``(rows, *shape)``; nullable fields add
    ``<name>__null.npy``; heap fields: ``<name>.payload.npy`` (uint8, the stored payloads back
    to back: PNG bytes, raw values, UTF-8 text), ``<name>.offsets.npy`` (int64, rows + 1) and, with
    variable dimensions, ``<name>.shape.npy`` (uint32, rows x k).
    """
    layout = Layout.open(path)
    names = layout.schema.select(fields).names
    st = os.stat(path)
    stamp = {
        "source": os.path.abspath(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "fields": names,
    }
    done = os.path.join(out_dir, NPY_DONE)
    if os.path.exists(done):
        try:
            with open(done) as fh:
                if json.load(fh) == stamp:
                    return out_dir
        except (OSError, ValueError):
            pass
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    n = layout.num_rows
    step = max(layout.rows_per_block, (64 << 20) // max(1, layout.row_dtype.itemsize))
    flds = [layout.schema[nm] for nm in names]
    h5 = _H5(path)
    try:
        outs: dict[str, np.memmap] = {}
        for f in flds:
            if f.nullable:
                outs[f.name + spec.NULL_SUFFIX] = np.lib.format.open_memmap(
                    os.path.join(tmp, f.name + spec.NULL_SUFFIX + ".npy"), "w+", np.bool_, (n,)
                )
            if f.inline:
                outs[f.name] = np.lib.format.open_memmap(
                    os.path.join(tmp, f.name + ".npy"), "w+", f.dtype, (n,) + tuple(f.shape)
                )
        heap_fields = [f for f in flds if not f.inline]
        # Pass 1: the references of the heap fields give the payload sizes.
        refs = {f.name: np.empty(n, spec.heap_ref_dtype(f)) for f in heap_fields}
        for a in range(0, n, step):
            rec = h5.rows[a : a + step]
            for f in flds:
                if f.nullable:
                    outs[f.name + spec.NULL_SUFFIX][a : a + len(rec)] = rec[
                        f.name + spec.NULL_SUFFIX
                    ]
                if f.inline:
                    outs[f.name][a : a + len(rec)] = rec[f.name]
                else:
                    refs[f.name][a : a + len(rec)] = rec[f.name]
        for f in heap_fields:
            ref = refs[f.name]
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(ref["nbytes"].astype(np.int64), out=offsets[1:])
            np.save(os.path.join(tmp, f.name + ".offsets.npy"), offsets)
            if f.variable_dims:
                np.save(
                    os.path.join(tmp, f.name + ".shape.npy"), np.ascontiguousarray(ref["shape"])
                )
            payload = np.lib.format.open_memmap(
                os.path.join(tmp, f.name + ".payload.npy"), "w+", np.uint8, (int(offsets[-1]),)
            )
            # Copy payloads in row ranges whose heap span is bounded.
            a = 0
            while a < n:
                b = min(n, a + 1)
                lo = int(ref["offset"][a])
                while (
                    b < n
                    and int(ref["offset"][b] + ref["nbytes"][b]) - lo < (64 << 20)
                    and b - a < step
                ):
                    b += 1
                hi = int((ref["offset"][a:b] + ref["nbytes"][a:b]).max())
                buf = h5.heap[lo:hi] if hi > lo else np.zeros(0, np.uint8)
                for i in range(a, b):
                    s = int(ref["offset"][i]) - lo
                    payload[offsets[i] : offsets[i + 1]] = buf[s : s + int(ref["nbytes"][i])]
                a = b
            payload.flush()
            del payload
        for arr in outs.values():
            arr.flush()
        outs.clear()
    finally:
        h5.close()
    with open(os.path.join(tmp, NPY_DONE), "w") as fh:
        json.dump(stamp, fh)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


def _memmap(layout: Layout, fields: list[Field], opts: dict) -> tuple[Callable, Callable]:
    d = opts.get("npy_dir")
    if not d or not os.path.exists(os.path.join(d, NPY_DONE)):
        raise RowstoreError(f"the memmap baseline needs an .npy export (export_npy) in {d!r}")

    def load(name: str) -> np.ndarray:
        return np.load(os.path.join(d, name + ".npy"), mmap_mode="r")

    arrays = {}
    for f in fields:
        if f.nullable:
            arrays[f.name + spec.NULL_SUFFIX] = load(f.name + spec.NULL_SUFFIX)
        if f.inline:
            arrays[f.name] = load(f.name)
        else:
            arrays[f.name + ".payload"] = load(f.name + ".payload")
            arrays[f.name + ".offsets"] = np.load(os.path.join(d, f.name + ".offsets.npy"))
            if f.variable_dims:
                arrays[f.name + ".shape"] = np.load(os.path.join(d, f.name + ".shape.npy"))

    def epoch(k: int) -> Iterator[dict]:
        for idx in _batches_of(uniform_order(layout.num_rows, opts["seed"], k), opts["batch_size"]):
            out: dict[str, Any] = {}
            for f in fields:
                nulls = None
                if f.nullable:
                    nulls = arrays[f.name + spec.NULL_SUFFIX][idx]
                    out[f.name + spec.NULL_SUFFIX] = nulls
                if f.inline:
                    out[f.name] = arrays[f.name][idx]
                    continue
                payload, offsets = arrays[f.name + ".payload"], arrays[f.name + ".offsets"]
                a, b = offsets[idx], offsets[idx + 1]
                shapes = arrays[f.name + ".shape"][idx] if f.variable_dims else None

                def get(off: int, nb: int, payload=payload):
                    return np.array(payload[off : off + nb])

                out[f.name] = decode_heap_field(f, a, b - a, shapes, nulls, get)
            yield out

    return epoch, lambda: None


_BASELINE_FACTORIES = {
    "h5py-row": _h5py_row,
    "h5py-fancy": _h5py_fancy,
    "tables-coords": _tables_coords,
    "tables-block": _tables_block,
    "memmap": _memmap,
}


# -- rowstore ------------------------------------------------------------------------------------
def _rowstore(layout: DatasetLayout, fields: list[Field], opts: dict) -> Source:
    return adapters.rowstore_source(layout, [f.name for f in fields], opts)


def open_layout(path: Any, storage_options: dict | None = None) -> DatasetLayout:
    """The layout of a local path (or list), or of a URL (opened as a reader opens it)."""
    from rowstore.format.open import open_layout as _open

    return _open(path, storage_options=storage_options, pin=False).layout


def open_source(opts: dict[str, Any]) -> Source:
    """Build the source that ``opts`` describe (the spec a bench child process receives).

    Keys: ``kind`` (``"rowstore"`` or a :data:`BASELINES` key), ``path``, ``fields``,
    ``batch_size``, ``shuffle``, ``window``, ``seed``, and for rowstore ``mode``, ``threads``,
    ``workers``, ``verify``; ``npy_dir`` for the memmap baseline. rowstore reads any dataset
    (``path`` a file, a dataset directory or a list); the baselines read one ``.h5`` file.
    """
    kind = opts["kind"]
    if kind == "rowstore":  # a file, a dataset directory or a list of those, or a URL
        dl = open_layout(opts["path"], opts.get("storage_options"))
        return _rowstore(dl, list(dl.schema.select(opts.get("fields"))), opts)
    if kind not in _BASELINE_FACTORIES:
        raise ValueError(
            f"unknown source {kind!r}; expected 'rowstore' or one of {sorted(_BASELINE_FACTORIES)}"
        )
    if not isinstance(opts["path"], str) or os.path.isdir(opts["path"]):
        raise ValueError(
            f"the {kind} baseline reads one HDF5 file, not a dataset of shards: {opts['path']!r}"
        )
    layout = Layout.open(opts["path"])
    fields = list(layout.schema.select(opts.get("fields")))
    names = [f.name for f in fields]
    B = opts["batch_size"]
    nblocks = layout.num_blocks
    epoch, close = _BASELINE_FACTORIES[kind](layout, fields, opts)
    label, desc = BASELINES[kind]
    if kind == "tables-block":

        def quality() -> float:
            order = _order.epoch_order(
                layout.block_rows(),
                layout.rows_per_block,
                shuffle="block",
                seed=opts["seed"],
                epoch=0,
                window=_baseline_window(opts),
                rank=0,
                world=1,
            )
            return _order.shuffle_quality(order, layout.rows_per_block, nblocks, B)

        label = f"{label} W={_baseline_window(opts)}"
    else:

        def quality() -> float:
            return _order.shuffle_quality(
                uniform_order(layout.num_rows, opts["seed"], 0), layout.rows_per_block, nblocks, B
            )

    return Source(
        label=label,
        description=desc,
        names=names,
        epoch=epoch,
        shuffle_quality=quality,
        num_batches=-(-layout.num_rows // B),
        close=close,
        var_dims=var_dims_of(fields),
    )
