"""Raw stored rows: row records and their heap payloads as bytes, moved between files undecoded.

A :class:`RawRows` holds rows exactly as a file stores them (a structured array of
:func:`spec.row_dtype`: inline values, encoded inline values, null flags, heap references) and
the heap bytes their references point to, packed in row order (a row's payloads, in schema
order, after every earlier row's). Nothing is decoded: a PNG stays the PNG bytes it was.
:func:`take_raw` cuts one from loaded blocks (any rows, any order), checking every reference
against its block's heap range (in the ``gather_heap`` kernel); :meth:`.Writer.write_raw`
appends one to a file, rewriting the references to the new heap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError
from rowstore.schema import Schema

__all__ = ["RawRows", "heap_refs", "take_raw", "first_overlap"]


def heap_refs(schema: Schema, row_dtype: np.dtype) -> list[tuple[str, int]]:
    """``(field name, byte offset of its heap reference in the row)`` of every heap field, in
    schema order."""
    cols = row_dtype.fields
    assert cols is not None  # spec.row_dtype is structured
    return [(f.name, int(cols[f.name][1])) for f in schema if not f.inline]


@dataclass(frozen=True)
class RawRows:
    """Stored rows and their payloads.

    Attributes
    ----------
    rows : numpy.ndarray
        Structured array of the file's row dtype (may be a view).
    heap : numpy.ndarray
        ``uint8``: the payloads of ``rows``, in row order, without gaps. A reference
        ``(offset, nbytes)`` of row ``i`` addresses ``heap[offset - origin : ... + nbytes]``.
    starts : numpy.ndarray
        ``int64``, ``len(rows) + 1``: row ``i``'s payloads are ``[starts[i], starts[i + 1])``
        in the references' coordinates (``starts[0] == origin``).
    origin : int
        The reference value of ``heap[0]``.
    """

    rows: np.ndarray
    heap: np.ndarray
    starts: np.ndarray
    origin: int = 0

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the row records plus payloads."""
        return int(self.rows.nbytes + self.heap.nbytes)

    def slice(self, a: int, b: int) -> RawRows:
        """Rows ``a:b`` (views: nothing is copied; references keep their coordinates)."""
        s = self.starts
        lo, hi = int(s[a]), int(s[b])
        return RawRows(
            self.rows[a:b], self.heap[lo - self.origin : hi - self.origin], s[a : b + 1], lo
        )

    @classmethod
    def empty(cls, row_dtype: np.dtype) -> RawRows:
        return cls(np.zeros(0, row_dtype), np.zeros(0, np.uint8), np.zeros(1, np.int64))


def take_raw(
    src: np.ndarray,
    row_dtype: np.dtype,
    refs: list[tuple[str, int]],
    idx: np.ndarray,
    heap: np.ndarray,
    *,
    base,
    lo,
    hi,
    rows_per_slot: int | None = None,
    where: str = "rows",
) -> RawRows:
    """Rows ``idx`` of the loaded rows ``src`` (``uint8``, a whole number of rows) with their
    payloads copied out of ``heap``, as a :class:`RawRows` (references rewritten, origin 0).

    ``src`` holds slots of ``rows_per_slot`` rows (loaded blocks; default: one slot of all of
    them); a reference of a row in slot ``s`` must lie in ``[lo[s], hi[s])``, its payload at
    ``heap[base[s] + offset]`` (``base``, ``lo``, ``hi``: one int each for one slot, or arrays).
    Sizes and references are bounded by their slot's range, and the payloads of distinct rows
    of a slot may not overlap (:func:`first_overlap`), before they size anything; the
    ``gather_heap``
    kernel checks each reference and destination while copying; a bad one is a
    :class:`~rowstore.errors.FormatError` (``where`` names the rows in its message).
    """
    rs = row_dtype.itemsize
    nsrc = len(src) // rs
    if len(src) != nsrc * rs:
        raise ValueError(
            f"take_raw: src holds {len(src)} bytes, not a whole number of {rs}-byte rows"
        )
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    m = len(idx)
    if m and (int(idx.min()) < 0 or int(idx.max()) >= nsrc):
        raise ValueError(f"take_raw: row index outside the {nsrc} loaded rows")
    # The new row records, copied as bytes (a structured fancy index copies field by field).
    rows = src[: nsrc * rs].reshape(nsrc, rs)[idx].reshape(-1).view(row_dtype)
    nf = len(refs)
    if not nf or not m:
        return RawRows(rows, np.zeros(0, np.uint8), np.zeros(m + 1, np.int64))
    lo_a, hi_a, base_a = (
        np.ascontiguousarray(np.atleast_1d(v), dtype=np.int64) for v in (lo, hi, base)
    )
    per = rows_per_slot if rows_per_slot is not None else max(nsrc, 1)
    slot = idx // per
    if int(slot.max()) >= len(lo_a):
        raise ValueError(f"take_raw: rows in slot {int(slot.max())}, {len(lo_a)} slot ranges given")
    span = (hi_a - lo_a)[slot]
    sizes = np.empty((m, nf), np.int64)
    col = np.empty(m, np.int64)
    for j, (_name, off) in enumerate(refs):
        kernels.gather_fixed(src, rs, off + 8, 8, idx, col)  # uint64 nbytes, read as int64
        sizes[:, j] = col
    bad = (sizes < 0) | (sizes > span[:, None])
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise FormatError(
            f"{where}: field {refs[j][0]!r}: row {int(idx[i])}: payload size {int(sizes[i, j])} "
            f"exceeds "
            f"the heap range of its block ({int(span[i])} bytes; corrupt file)",
            field=refs[j][0],
        )
    for j, (name, off) in enumerate(
        refs
    ):  # each payload inside its block's range, apart from the others
        kernels.gather_fixed(src, rs, off, 8, idx, col)
        inside = (col >= lo_a[slot]) & (col <= hi_a[slot] - sizes[:, j])
        outside = (sizes[:, j] > 0) & ~inside
        i = (
            int(np.argmax(outside))
            if outside.any()
            else first_overlap(idx, slot, col, sizes[:, j], inside & (sizes[:, j] > 0))
        )
        if i is not None:
            why = "points outside" if outside.any() else "overlaps another row's payload in"
            raise FormatError(
                f"{where}: field {name!r}: row {int(idx[i])}: a payload reference {why} the heap "
                f"range of its block (corrupt file)",
                field=name,
                row=int(idx[i]),
            )
    flat = np.zeros(m * nf + 1, np.int64)
    np.cumsum(sizes.reshape(-1), out=flat[1:])
    out = np.empty(int(flat[-1]), np.uint8)
    dst = flat[:-1].reshape(m, nf)  # row-major: row i's payloads in schema order, after row i-1's
    for j, (name, off) in enumerate(refs):
        d = np.ascontiguousarray(dst[:, j])
        try:
            kernels.gather_heap(src, rs, off, idx, per, lo_a, hi_a, base_a, heap, out, d)
        except kernels.KernelError as exc:
            row = int(idx[exc.index]) if 0 <= exc.index < m else None
            raise FormatError(
                f"{where}: field {name!r}: row {row}: {str(exc).split(': ', 1)[-1]}",
                field=name,
                row=row,
            ) from None
        rows[name]["offset"] = d.astype(np.uint64)
    starts = np.empty(m + 1, np.int64)
    starts[:m] = dst[:, 0]
    starts[m] = flat[-1]
    return RawRows(rows, out, starts)


def first_overlap(
    rows: np.ndarray, blk: np.ndarray, starts: np.ndarray, nbytes: np.ndarray, inside: np.ndarray
) -> int | None:
    """The position of a row whose payload overlaps another row's in the same block, or None
    (among the rows ``inside``: non-empty payloads within their block's heap range).

    A writer stores each payload once, so the non-empty payloads of distinct rows of a block
    are disjoint: what a batch copies out of a block's heap is then bounded by that block's
    heap range, whatever its rows reference (a file whose rows all point at one payload would
    otherwise make a batch of n rows copy n times the file). A row asked for twice is one row.
    """
    _, first = np.unique(rows, return_index=True)
    keep = first[inside[first]]
    if len(keep) < 2:
        return None
    order = keep[np.lexsort((starts[keep], blk[keep]))]
    b, s = blk[order], starts[order]
    bad = (b[1:] == b[:-1]) & (s[1:] < s[:-1] + nbytes[order[:-1]])
    return int(order[1:][np.argmax(bad)]) if bad.any() else None
