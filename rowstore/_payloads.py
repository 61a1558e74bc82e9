"""Decoders of binary payloads: ``.npy``, ``.npz``, PNG and JPEG bytes into arrays.

:class:`Decode` is one decoder and an optional target field; before it decodes a payload it
bounds what the payload's header declares (an npz member of gigabytes, a PNG of gigapixels is
refused before anything is allocated). :mod:`rowstore.arrow` (the ``payloads=`` option) and the
Petastorm Unischema reader (:mod:`rowstore._unischema`, its codecs) share them. Only numpy, and
imagecodecs for images, are needed.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from rowstore.format import spec
from rowstore.schema import BYTES, STR, Field

__all__ = ["DECODERS", "Decode"]


#: Bytes an ``.npy`` header may take besides the values (numpy pads it to 64 and refuses one
#: over 10,000 bytes; version 2 allows up to 4 GiB, which no array of ours needs).
_NPY_HEADER_BYTES = 1 << 16


def _npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the ``.npy`` header at ``f``'s position, ``f`` left
    at the first byte of the values; object arrays and negative dimensions are refused."""
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise ValueError(f"npy version {version} is not supported")
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(f)
    if dtype.hasobject:
        raise ValueError("an npy payload of Python objects is refused (pickles are never loaded)")
    if any(d < 0 for d in shape):
        raise ValueError(f"the npy header declares a negative dimension: {shape}")
    return tuple(shape), bool(fortran), dtype


def _npy_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of the values an ``.npy`` header declares (Python ints: no wrap-around)."""
    return math.prod(shape) * dtype.itemsize


def _too_many(shape: tuple[int, ...], dtype: np.dtype, nbytes: int, held: int) -> ValueError:
    return ValueError(
        f"the npy header declares {shape} of {dtype} ({nbytes} bytes), the payload holds {held}"
    )


def _array(
    buf: Any, shape: tuple[int, ...], fortran: bool, dtype: np.dtype, offset: int = 0
) -> np.ndarray:
    """The values in ``buf`` from ``offset`` on as an array of ``shape`` (C order)."""
    count = math.prod(shape)
    if not count or not dtype.itemsize:
        return np.zeros(shape, dtype)
    a = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    return a.reshape(shape, order="F" if fortran else "C")


def _npy(b: bytes) -> np.ndarray:
    """An ``.npy`` payload, its header checked before anything is allocated: the data it
    declares must be in the payload (a hostile header cannot make it allocate more)."""
    f = io.BytesIO(b)
    shape, fortran, dtype = _npy_header(f)
    nbytes = _npy_nbytes(shape, dtype)
    start = f.tell()
    if nbytes > len(b) - start or nbytes > spec.MAX_VALUE_BYTES:
        raise _too_many(shape, dtype, nbytes, len(b) - start)
    return _array(b, shape, fortran, dtype, start).copy()


def _npz_member(z: Any) -> Any:
    """The one member of an ``.npz`` zip (its ``ZipInfo``); its declared size bounded."""
    infos = z.infolist()
    if len(infos) != 1:
        raise ValueError(f"an npz payload holds one array, this one {len(infos)}")
    if infos[0].file_size > spec.MAX_VALUE_BYTES + _NPY_HEADER_BYTES:
        raise ValueError(f"the npz member declares {infos[0].file_size} bytes")
    return infos[0]


def _npz_header(member: IO[bytes], size: int) -> tuple[tuple[int, ...], bool, np.dtype, bytes]:
    """The ``.npy`` header of an npz member of declared ``size`` bytes, read from its
    decompressing stream ``member`` (at most :data:`_NPY_HEADER_BYTES` inflated); also the
    bytes of values read with it. The values it declares must be the rest of the member."""
    head = member.read(min(size, _NPY_HEADER_BYTES))
    f = io.BytesIO(head)
    shape, fortran, dtype = _npy_header(f)  # (a header cut short: numpy's ValueError "EOF...")
    nbytes, start = _npy_nbytes(shape, dtype), f.tell()
    if nbytes != size - start or nbytes > spec.MAX_VALUE_BYTES:
        raise ValueError(
            f"the npy header declares {shape} of {dtype} ({nbytes} bytes), the npz member "
            f"{size - start} bytes of values"
        )
    return shape, fortran, dtype, head[start:]


def _npz(b: bytes) -> np.ndarray:
    """The one array of an ``.npz`` payload (``numpy.savez``/``savez_compressed``). What is
    inflated is bounded by the header before it is read (no zip bomb): the member's declared
    size and its npy header must agree, and no more than that size is ever inflated."""
    import zipfile

    with zipfile.ZipFile(io.BytesIO(b)) as z:
        info = _npz_member(z)
        with z.open(info) as member:
            shape, fortran, dtype, got = _npz_header(member, info.file_size)
            out = np.empty(_npy_nbytes(shape, dtype), np.uint8)
            out[: len(got)] = np.frombuffer(got, np.uint8)
            pos = len(got)
            while pos < len(out):  # (the stream itself stops at the declared size)
                chunk = member.read(min(len(out) - pos, 1 << 22))
                if not chunk:
                    raise ValueError(
                        f"the npz member ends after {pos} of its {len(out)} bytes of values"
                    )
                out[pos : pos + len(chunk)] = np.frombuffer(chunk, np.uint8)
                pos += len(chunk)
            member.read(1)  # at the end: the stream checks the member's CRC
    a = _array(out, shape, fortran, dtype)  # a view of out
    return a.copy() if fortran else a  # always in C order


def declared_array(how: str, b: bytes) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` that an ``npy`` or ``npz`` payload's header declares, read without
    decoding the values (an npz member: only its header is inflated)."""
    if how == "npy":
        shape, _, dtype = _npy_header(io.BytesIO(b))
        return shape, dtype
    if how != "npz":
        raise ValueError(f"{how!r} payloads have no npy header")
    import zipfile

    with zipfile.ZipFile(io.BytesIO(b)) as z:
        info = _npz_member(z)
        with z.open(info) as member:
            shape, _, dtype, _ = _npz_header(member, info.file_size)
    return shape, dtype


def _image(kind: str) -> Callable[[bytes], np.ndarray]:
    def decode(b: bytes) -> np.ndarray:
        import imagecodecs

        return imagecodecs.png_decode(b) if kind == "png" else imagecodecs.jpeg8_decode(b)

    return decode


#: Decoders of binary payloads by name: bytes -> ndarray.
DECODERS: dict[str, Callable[[bytes], np.ndarray]] = {
    "npy": _npy,
    "npz": _npz,
    "png": _image("png"),
    "jpeg": _image("jpeg"),
}


def _be(b: bytes, i: int, n: int) -> int:
    if i + n > len(b):
        raise ValueError("the payload ends inside its header")
    return int.from_bytes(b[i : i + n], "big")


def _declared(how: str, b: bytes) -> tuple[float | None, float] | None:
    """``(values, bytes)`` a payload's header declares its decoded array to hold (values None
    where the header does not tell), read without decoding; None for a decoder not built in."""
    if how == "png":  # the IHDR chunk comes first: width, height, bit depth, colour type
        if b[:8] != b"\x89PNG\r\n\x1a\n" or b[12:16] != b"IHDR":
            raise ValueError("not a PNG (no IHDR header)")
        w, h, depth, colour = _be(b, 16, 4), _be(b, 20, 4), _be(b, 24, 1), _be(b, 25, 1)
        values = float(w) * h * {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(colour, 4)
        return values, values * (2 if depth == 16 else 1)
    if how == "jpeg":  # the first SOFn segment: precision, height, width, components
        if b[:2] != b"\xff\xd8":
            raise ValueError("not a JPEG (no SOI marker)")
        i = 2
        while True:
            if _be(b, i, 1) != 0xFF:
                raise ValueError(f"not a JPEG marker at byte {i}")
            marker = _be(b, i + 1, 1)
            if marker == 0xFF:  # fill byte
                i += 1
            elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                bits, h, w, comps = (
                    _be(b, i + 4, 1),
                    _be(b, i + 5, 2),
                    _be(b, i + 7, 2),
                    _be(b, i + 9, 1),
                )
                values = float(h) * w * comps
                return values, values * (2 if bits > 8 else 1)
            elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:
                i += 2
            else:
                i += 2 + _be(b, i + 2, 2)
    if how in ("npy", "npz"):  # an npz member: its npy header, not only the zip's size
        shape, dtype = declared_array(how, b)
        values = float(math.prod(shape))
        return values, values * dtype.itemsize
    return None


@dataclass(frozen=True)
class Decode:
    """How one binary column becomes a typed field: a decoder name of :data:`DECODERS` and an
    optional target field (dtype, shape, codec).

    Before a payload is decoded, the size its header declares is bounded: by the field's
    shape where all its dimensions are fixed (as many values, whatever their dtype), else by
    the format's limit per value (``spec.MAX_VALUE_BYTES``); a payload declaring more is
    refused unallocated (a PNG header may declare gigapixels, an npz member gigabytes). An
    ``npy``/``npz`` header must also declare the field's rank and fixed dimensions (an npz
    member's header is read from the first inflated bytes, the rest is never inflated).
    """

    how: str
    field: Field | None = None

    def __call__(self, b: bytes) -> np.ndarray:
        f = self.field
        if self.how in ("npy", "npz") and f is not None and f.dtype not in (STR, BYTES):
            shape, _ = declared_array(self.how, b)  # before any value is inflated or copied
            if len(shape) != len(f.shape) or any(
                d is not None and d != s for d, s in zip(f.shape, shape)
            ):
                dims = ", ".join("?" if d is None else str(d) for d in f.shape)
                raise ValueError(
                    f"the {self.how} header declares an array of shape {shape}, the field "
                    f"holds shape ({dims}{',' if len(f.shape) == 1 else ''})"
                )
        declared = _declared(self.how, b)
        if declared is not None:
            values, nbytes = declared
            if nbytes > spec.MAX_VALUE_BYTES:
                raise ValueError(
                    f"the {self.how} header declares {nbytes:.0f} bytes of values, more than "
                    f"the format's limit of {spec.MAX_VALUE_BYTES} per value"
                )
            if f is not None and f.shape and None not in f.shape:
                want = float(np.prod(f.shape, dtype=np.float64))
                if values is not None and values > want:
                    raise ValueError(
                        f"the {self.how} header declares {values:.0f} values, the field "
                        f"{f.shape} holds {want:.0f}"
                    )
                cap = want * max(16, getattr(f.dtype, "itemsize", 16)) + _NPY_HEADER_BYTES
                if values is None and nbytes > cap:
                    raise ValueError(
                        f"the {self.how} payload declares {nbytes:.0f} bytes, more than the "
                        f"field {f.shape} can hold"
                    )
        return DECODERS[self.how](b)
