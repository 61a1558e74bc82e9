"""Decode: gathered columns into the values handed out, by each field's codec.

Raw bytes in the row are already final (the kernels put them in their batch arrays); a raw
variable-shape field becomes a :class:`~rowstore.reader.buffers.Ragged` view of its payload
bytes; every other field is decoded by its codec's ``decode_batch`` into an array allocated
here from the schema (or the caller's ``out=``), on the decode pool when the codec releases
the GIL. PNG images (the built-in ``png`` codec) are decoded by a kernel instead, a range of
images of a fixed shape per call and thread without the GIL (:func:`_png_batch`), or one
image of a variable shape per call (:func:`_png_each`); the images it leaves undecoded go
through the codec, which decodes them or refuses damaged bytes. A ``jpeg`` field read
through an image op (``decode=`` of the epoch, :mod:`rowstore.reader.image_ops`) is decoded,
cropped and resized to the op's fixed size by the JPEG kernel (:func:`_jpeg_batch`); without
an op the ``jpeg`` codec decodes it (with the kernel too, whole). Sizes that come from the
file are checked against the limits of :mod:`rowstore.format.spec` before they size an
allocation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.codecs import Payloads, Png
from rowstore.codecs.abc import Codec, ParallelMap, serial
from rowstore.codecs.audio import status_error as audio_status_error
from rowstore.errors import CodecError, CodecNotAvailableError, FormatError
from rowstore.format import spec
from rowstore.reader import audio_ops, image_ops
from rowstore.reader._gather import FieldPlan, Gathered
from rowstore.reader.buffers import Ragged

__all__ = ["Decoder"]

#: Decode ``png`` fields of fixed shape with ``kernels.png_decode_batch`` (False: through the
#: codec, image by image with imagecodecs; for A/B benchmarks and tests).
PNG_KERNEL = True


class Decoder:
    """Decodes gathered columns (one per reader; thread-safe).

    Its thread pool, for codecs that release the GIL, is created on first need and reused by
    every later call (``take`` per torch batch included); it is private to the process that
    made it (a forked child makes its own) and ends with :meth:`close`.
    """

    def __init__(
        self,
        path: str,
        where: Callable[[int], tuple[str, int, int]],
        rows_of: Callable[[np.ndarray], np.ndarray] | None = None,
    ):
        self.path = path  # the dataset's, for errors that concern no row
        self.where = where  # row id -> (shard path, block in the shard, dataset row), for errors
        self.rows_of = rows_of or (lambda ids: ids)  # row ids -> dataset rows (image op keys)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._workers = 0
        self._pid = 0

    # -- the pool ----------------------------------------------------------------------------
    def parallel(self, threads: int) -> ParallelMap:
        """A :data:`ParallelMap` over ``threads`` pooled threads (serial for 1)."""
        if threads <= 1:
            return serial
        pool = self._pool_of(threads)

        def run(fn: Callable[[int, int], None], n: int) -> None:
            k = min(threads, n // 4)
            if k <= 1:
                fn(0, n)
                return
            bounds = np.linspace(0, n, k + 1).astype(int)
            for fut in [pool.submit(fn, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]:
                fut.result()

        return run

    def _pool_of(self, threads: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid() or self._workers < threads:
                if self._pool is not None and self._pid == os.getpid():
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rowstore-decode")
                self._workers, self._pid = threads, os.getpid()
            return self._pool

    def close(self, *, wait: bool = True) -> None:
        """Stop the decode threads (``wait=False`` from a finaliser, which may run on one)."""
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    # -- decoding ----------------------------------------------------------------------------
    def decode(
        self,
        g: Gathered,
        plans: list[FieldPlan],
        out: dict | None = None,
        out_start: int = 0,
        threads: int = 1,
        images: dict[str, tuple[image_ops.ImageOp, int]] | None = None,
    ) -> dict[str, Any]:
        """The batch dict of ``g``: every selected field decoded, null flags kept; the fields
        of ``images`` (``{field: (op, base)}``: the op and its epoch's key base) through their
        image op."""
        batch = g.columns
        par: ParallelMap | None = None
        for p in plans:
            col = batch[p.field.name]
            if not isinstance(col, Payloads):
                continue  # raw bytes, already in their batch array
            if p.field.codec_obj.releases_gil and par is None:
                par = self.parallel(threads)
            if images and p.field.name in images:
                op, base = images[p.field.name]
                if isinstance(op, audio_ops.AudioOp):
                    batch[p.field.name] = self._audio(p, col, g, op, base, par or serial)
                    continue
                batch[p.field.name] = self._image(p, col, g, op, base, par or serial)
                continue
            batch[p.field.name] = self._field(p, col, g, out, out_start, par or serial)
        return batch

    def _image(
        self,
        p: FieldPlan,
        col: Payloads,
        g: Gathered,
        op: image_ops.ImageOp,
        base: int,
        par: ParallelMap,
    ) -> np.ndarray:
        """A jpeg column through its image op: ``n x H x W[ x C]`` uint8."""
        f = p.field
        c = f.shape[2] if len(f.shape) == 3 else 1
        dst = np.empty((len(col),) + op.size + ((c,) if len(f.shape) == 3 else ()), np.uint8)
        rows = np.ascontiguousarray(self.rows_of(g.row_ids()), np.int64)
        status = np.zeros(len(col), np.uint8)
        _jpeg_batch(op, base, col, rows, dst, c, status, par)
        bad = np.flatnonzero(status)
        if len(bad):
            i = int(bad[0])
            why = kernels.JPEG_WHY.get(int(status[i]), f"status {int(status[i])}")
            if status[i] == kernels.JPEG_NOMEM:
                raise MemoryError(f"field {f.name!r}: no memory to decode a JPEG image")
            path, blk, row = self.where(int(g.row_ids()[i]))
            raise FormatError(
                f"{path!r}: field {f.name!r}: row {row}: stored JPEG does not decode ({why}; "
                f"corrupt file?)",
                path=path,
                block=blk,
                field=f.name,
                row=row,
            ) from CodecError(why, codec="jpeg", field=f.name)
        return dst

    def _audio(
        self,
        p: FieldPlan,
        col: Payloads,
        g: Gathered,
        op: audio_ops.AudioOp,
        base: int,
        par: ParallelMap,
    ) -> np.ndarray:
        """A flac/wav column through its audio op: a fixed-shape window per row."""
        rows = np.ascontiguousarray(self.rows_of(g.row_ids()), np.int64)
        dst, status = audio_ops.decode_segments(op, base, p.field, col, rows, par)
        bad = np.flatnonzero(status)
        if len(bad):
            i = int(bad[0])
            exc = audio_status_error(p.field.codec_obj.codec_id, int(status[i]))
            if isinstance(exc, MemoryError):
                raise MemoryError(f"field {p.field.name!r}: {exc}")
            path, blk, row = self.where(int(g.row_ids()[i]))
            raise FormatError(
                f"{path!r}: field {p.field.name!r}: row {row}: stored audio does not decode "
                f"({exc}; corrupt file?)",
                path=path,
                block=blk,
                field=p.field.name,
                row=row,
            ) from exc
        return dst

    def _field(
        self,
        p: FieldPlan,
        col: Payloads,
        g: Gathered,
        out: dict | None,
        out_start: int,
        par: ParallelMap,
    ) -> Any:
        f, codec = p.field, p.field.codec_obj
        n = len(col)
        if col.shapes is not None:
            elems = self._elements(p, col, g)
            if codec.raw_bytes:
                return Ragged(col.data.view(f.dtype), elems, col.shapes)
            dst = np.empty(int(elems[-1]), f.dtype)
        elif f.numpy_dtype.kind == "O":
            dst = np.empty(n, object)
        else:
            if (
                f.fixed_nbytes > spec.MAX_VALUE_BYTES
            ):  # a schema (from the file) asking for too much
                raise FormatError(
                    f"{self.path!r}: field {f.name!r}: values of shape {f.shape} exceed the "
                    f"format's limit "
                    f"of {spec.MAX_VALUE_BYTES} bytes per value",
                    path=self.path,
                    field=f.name,
                )
            given = out.get(f.name) if out else None
            dst = (
                given[out_start : out_start + n]
                if given is not None
                else np.empty((n,) + f.shape, f.dtype)
            )
            if col.nulls is not None:
                dst[col.nulls] = 0
        try:
            if col.shapes is None and _png_kernel_fits(codec, dst):
                _png_batch(codec, col, dst, par)
            elif col.shapes is not None and _png_kernel_fits(codec, dst.reshape(1, 1, -1)):
                _png_each(codec, col, dst, elems, par)
            else:
                codec.decode_batch(col, dst, par if codec.releases_gil else serial)
        except CodecNotAvailableError:
            raise
        except (CodecError, ValueError) as exc:
            raise self._corrupt(p, col, g, exc) from exc
        if col.shapes is not None:
            return Ragged(dst, elems, col.shapes)
        if dst.dtype == object and col.nulls is not None:
            dst[col.nulls] = None
        return dst

    def _elements(self, p: FieldPlan, col: Payloads, g: Gathered) -> np.ndarray:
        """Element offsets of a variable-shape column, each value's size checked first: raw
        payloads must hold exactly their shape's bytes, decoded values must fit the format's
        per-value limit (a hostile shape must not size an allocation)."""
        f = p.field
        assert col.shapes is not None  # variable shapes come with their shapes
        item = f.dtype.itemsize
        # Sizes in float64 first: an int64 product of hostile dimensions can wrap around to any
        # value (also one that matches the payload); float64 is exact below 2**53 bytes.
        nbytes = np.prod(col.shapes.astype(np.float64), axis=1) * item
        if f.codec_obj.raw_bytes:
            bad = nbytes != np.diff(col.offsets)
            why = "payload size disagrees with its stored shape"
        else:
            bad = nbytes > spec.MAX_VALUE_BYTES
            why = (
                f"stored shape exceeds the format's limit of {spec.MAX_VALUE_BYTES} bytes per value"
            )
        if bad.any():
            i = int(np.argmax(bad))
            path, blk, row = self.where(int(g.row_ids()[i]))
            raise FormatError(
                f"{path!r}: field {f.name!r}: row {row}: {why} (shape {tuple(col.shapes[i])}; "
                f"corrupt file)",
                path=path,
                block=blk,
                field=f.name,
                row=row,
            )
        elems = np.zeros(len(col) + 1, np.int64)
        np.cumsum(np.prod(col.shapes, axis=1), out=elems[1:])  # bounded now: no wrap-around
        return elems

    def _corrupt(self, p: FieldPlan, col: Payloads, g: Gathered, exc: Exception) -> FormatError:
        """A FormatError naming the first row whose value does not decode (found by decoding
        value by value, on this error path only)."""
        f = p.field
        i = _first_failure(f, col)
        path, blk, row = (
            self.where(int(g.row_ids()[i])) if i is not None else (self.path, None, None)
        )
        where = f"row {row}: " if row is not None else ""
        return FormatError(
            f"{path!r}: field {f.name!r}: {where}stored value does not decode ({exc}; corrupt "
            f"file?)",
            path=path,
            block=blk,
            field=f.name,
            row=row,
        )


def _png_kernel_fits(codec: Codec, dst: np.ndarray) -> bool:
    """Whether the PNG kernel decodes into ``dst``: the built-in ``png`` codec (a codec
    registered in its place decodes itself), a native uint8/uint16 C-contiguous array."""
    return (
        PNG_KERNEL
        and type(codec) is Png
        and dst.dtype in (np.uint8, np.uint16)
        and dst.ndim in (3, 4)
        and dst.flags.c_contiguous
        and dst.flags.writeable
    )


def _scale16(codec: Codec) -> bool:
    """Whether a 16-bit PNG goes into uint8 by its high bytes (the codec's ``depth`` rule)."""
    return getattr(codec, "depth", None) == "scale"


def _png_batch(codec: Codec, col: Payloads, dst: np.ndarray, par: ParallelMap) -> None:
    """Decode a batch of PNG images into ``dst`` (``n x shape``): each range of images in one
    kernel call without the GIL, on the decode threads; an image the kernel leaves undecoded
    (another kind of PNG, or damaged bytes) goes through ``codec.decode_into``, which decodes it
    or raises the CodecError that names it."""
    status = np.zeros(len(col), np.uint8)

    def run(lo: int, hi: int) -> None:
        if kernels.png_decode_batch(
            col.data, col.offsets, col.nulls, dst, lo, hi, status, scale16=_scale16(codec)
        ):
            for i in lo + np.flatnonzero(status[lo:hi]):
                codec.decode_into(col.payload(int(i)), dst[i])

    par(run, len(col))


def _png_each(
    codec: Codec, col: Payloads, dst: np.ndarray, elems: np.ndarray, par: ParallelMap
) -> None:
    """Decode PNG images of a variable-shape field into the flat ``dst`` (image i is
    ``dst[elems[i]:elems[i + 1]]`` of its stored shape): one kernel call per image, on the
    decode threads; an image the kernel leaves undecoded goes through ``codec.decode_into``."""
    shapes = col.shapes
    assert shapes is not None  # variable shapes come with their shapes

    def run(lo: int, hi: int) -> None:
        status = np.zeros(1, np.uint8)
        for i in range(lo, hi):
            if col.is_null(i):
                continue
            one = dst[elems[i] : elems[i + 1]].reshape((1, *(int(v) for v in shapes[i])))
            if one.ndim not in (3, 4) or kernels.png_decode_batch(
                col.data, col.offsets[i : i + 2], None, one, 0, 1, status, scale16=_scale16(codec)
            ):
                codec.decode_into(col.payload(i), one[0])

    par(run, len(col))


#: Decode ``jpeg`` fields read through an image op with ``kernels.jpeg_decode_batch`` (False,
#: or no kernel built: :func:`rowstore.reader.image_ops.decode_reference`, image by image).
JPEG_KERNEL = True


def _jpeg_batch(
    op: image_ops.ImageOp,
    base: int,
    col: Payloads,
    rows: np.ndarray,
    dst: np.ndarray,
    channels: int,
    status: np.ndarray,
    par: ParallelMap,
) -> None:
    """Decode a batch of JPEG images through ``op`` into ``dst``: each range of images in one
    kernel call without the GIL, on the decode threads; ``status`` gets each image's code.
    Without the kernel, the reference decoder (imagecodecs, then NumPy)."""
    use_kernel = JPEG_KERNEL and kernels.JPEG_AVAILABLE
    args = op.kernel_args()  # the kernel sees numbers, not the op

    def run(lo: int, hi: int) -> None:
        if use_kernel:
            kernels.jpeg_decode_batch(
                col.data,
                col.offsets,
                col.nulls,
                rows,
                base,
                dst,
                lo,
                hi,
                status,
                **args,
                max_bytes=image_ops.MAX_DECODED_BYTES,
            )
            return
        for i in range(lo, hi):
            if col.is_null(i):
                dst[i] = 0
                continue
            try:
                img, _ = image_ops.decode_reference(
                    op, col.payload(i), image_ops.row_key(base, int(rows[i])), channels
                )
            except Exception:
                status[i] = kernels.JPEG_CORRUPT
                continue
            dst[i] = img.reshape(dst[i].shape)

    par(run, len(col))


def _first_failure(f: Any, col: Payloads) -> int | None:
    codec = f.codec_obj
    for i in range(len(col)):
        if col.is_null(i):
            continue
        shape = tuple(col.shapes[i]) if col.shapes is not None else f.shape
        try:
            codec.decode_into(col.payload(i), np.empty(shape, f.numpy_dtype))
        except Exception:
            return i
    return None
