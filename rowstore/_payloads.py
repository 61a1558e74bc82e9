"""Decoders of binary payloads: ``.npy``, ``.npz``, PNG and JPEG bytes into arrays.

:class:`Decode` is one decoder and an optional target field; before it decodes a payload it
bounds what the payload's header declares (an npz member of gigabytes, a PNG of gigapixels is
refused before anything is allocated). :mod:`rowstore.arrow` (the ``decode=`` option) and the
Petastorm Unischema reader (:mod:`rowstore._unischema`, its codecs) share them. Only numpy, and
imagecodecs for images, are needed.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rowstore.format import spec
from rowstore.schema import Field

__all__ = ["DECODERS", "Decode"]


def _npy(b: bytes) -> np.ndarray:
    """An ``.npy`` payload, its header checked before anything is allocated: the data it
    declares must be in the payload (a hostile header cannot make it allocate more)."""
    f = io.BytesIO(b)
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
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
    start = f.tell()
    if nbytes > len(b) - start or nbytes > spec.MAX_VALUE_BYTES:
        raise ValueError(
            f"the npy header declares {shape} of {dtype} ({nbytes} bytes), the payload holds "
            f"{len(b) - start}"
        )
    a = np.frombuffer(
        b, dtype=dtype, count=nbytes // dtype.itemsize if dtype.itemsize else 0, offset=start
    )
    return a.reshape(shape, order="F" if fortran else "C").copy()


def _npz(b: bytes) -> np.ndarray:
    """The one array of an ``.npz`` payload (``numpy.savez``/``savez_compressed``), its
    uncompressed size checked first (no zip bomb)."""
    import zipfile

    with zipfile.ZipFile(io.BytesIO(b)) as z:
        infos = z.infolist()
        if len(infos) != 1:
            raise ValueError(f"an npz payload holds one array, this one {len(infos)}")
        if infos[0].file_size > spec.MAX_VALUE_BYTES:
            raise ValueError(f"the npz member declares {infos[0].file_size} bytes")
        with z.open(infos[0]) as member:
            data = member.read(spec.MAX_VALUE_BYTES + 1)
    return _npy(data)


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
    if how == "npy":
        f = io.BytesIO(b)
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read(f)
        values = float(np.prod(shape, dtype=np.float64))
        return values, values * dtype.itemsize
    if how == "npz":  # the member's declared size, which also bounds what zipfile inflates
        import zipfile

        with zipfile.ZipFile(io.BytesIO(b)) as z:
            return None, float(sum(i.file_size for i in z.infolist()))
    return None


#: Bytes an ``.npy`` header may take besides the values (numpy pads it to 64; version 2 allows
#: up to 4 GiB, which no array of ours needs).
_NPY_HEADER_BYTES = 1 << 16


@dataclass(frozen=True)
class Decode:
    """How one binary column becomes a typed field: a decoder name of :data:`DECODERS` and an
    optional target field (dtype, shape, codec).

    Before a payload is decoded, the size its header declares is bounded: by the field's
    shape where all its dimensions are fixed (as many values, whatever their dtype), else by
    the format's limit per value (``spec.MAX_VALUE_BYTES``); a payload declaring more is
    refused unallocated (a PNG header may declare gigapixels, an npz member gigabytes).
    """

    how: str
    field: Field | None = None

    def __call__(self, b: bytes) -> np.ndarray:
        declared = _declared(self.how, b)
        if declared is not None:
            values, nbytes = declared
            if nbytes > spec.MAX_VALUE_BYTES:
                raise ValueError(
                    f"the {self.how} header declares {nbytes:.0f} bytes of values, more than "
                    f"the format's limit of {spec.MAX_VALUE_BYTES} per value"
                )
            f = self.field
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
