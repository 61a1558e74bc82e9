"""Block compression: how the chunks of ``/rows`` and ``/heap`` are stored.

A block compression is a bytes-to-bytes codec applied to whole chunks (a block of packed rows, a
heap chunk). Like a field codec (:mod:`rowstore.codecs`) it is a small, frozen, JSON-configurable
object; its :meth:`~BlockCompression.get_config` is stored in the file's ``compression``
attribute, so a file says how to read itself. Built-ins, registered in one block at the end of
this module:

============  =================================================================================
id            stored chunk
============  =================================================================================
``none``      the raw bytes: an uncompressed chunk is exactly its packed rows or heap bytes
``blosc2``    one Blosc2 frame, through HDF5 filter 32026 (``cname``, ``clevel``, ``shuffle``)
============  =================================================================================

The Blosc2 names, codes and filter id are declared here only (:data:`BLOSC2_FILTER_ID`,
:data:`BLOSC2_CODECS`, :data:`BLOSC2_SHUFFLES`); the kernels take the integer codes.
:func:`block_compression` turns the writer's ``compression=`` argument (or a stored config) into
one of these objects, :func:`compression_config` into the stored config;
:func:`register_block_compression` adds a third-party one. The writer
uses :meth:`~BlockCompression.compress` and :meth:`~BlockCompression.hdf5_filter_kwargs`; the
reader passes :meth:`~BlockCompression.frame_check` to ``kernels.load_chunks`` so that the
kernel refuses a chunk whose header names another codec or shuffle.

Objects are immutable and may be shared by threads; ``compress`` and ``decompress_into`` of
``blosc2`` run in a kernel that releases the GIL.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rowstore import kernels
from rowstore.codecs.registry import add_to_registry
from rowstore.errors import CodecError, FormatError

__all__ = [
    "BlockCompression",
    "NoCompression",
    "Blosc2",
    "block_compression",
    "compression_config",
    "register_block_compression",
    "registered_block_compressions",
    "BLOSC2_FILTER_ID",
    "BLOSC2_CODECS",
    "BLOSC2_SHUFFLES",
    "BLOSC2_MIN_SAVING",
]

#: HDF5 filter id of the Blosc2 filter (PyTables, hdf5plugin): each chunk is one Blosc2 frame.
BLOSC2_FILTER_ID = 32026
#: Blosc2 compressors (``cname`` in the stored config) and their codes in ``blosc2.h``. (Listed in
#: the order error messages have always named them.)
BLOSC2_CODECS = {"lz4": 1, "lz4hc": 2, "zstd": 5, "blosclz": 0, "zlib": 4}
#: Blosc2 shuffle filters (``shuffle`` in the stored config) and their codes in ``blosc2.h``
#: (``BLOSC_NOSHUFFLE``, ``BLOSC_SHUFFLE``, ``BLOSC_BITSHUFFLE``; hdf5plugin uses the same ints).
BLOSC2_SHUFFLES = {"none": 0, "byte": 1, "bit": 2}
#: A Blosc2 chunk that compresses by less than this fraction of its raw size is stored
#: memcpy'd instead (Blosc2's own uncompressed chunk: clevel 0, ``BLOSC_MEMCPYED`` in its header,
#: which every Blosc2 reader decodes as a copy). Decompressing LZ4 + byte shuffle runs at about
#: 2.7 GB/s per core, a copy at 10 GB/s: saving 10% of the bytes pays for the difference only
#: when the chunks come from a store slower than about 0.3 GB/s (``docs/performance.md``).
BLOSC2_MIN_SAVING = 0.10


class BlockCompression(abc.ABC):
    """Base class of block compressions.

    Subclasses are frozen dataclasses (``@dataclass(frozen=True, kw_only=True)``) whose fields
    are their configuration (JSON values only; validated in ``__post_init__``): the dataclass
    gives them immutability, equality, hashing and a repr, and :meth:`get_config` lists the
    fields. They set ``compression_id`` (and ``compressed = False`` if stored chunks are the raw
    bytes) and implement the abstract methods.

    The compiled read path decodes only chunks that are raw bytes or Blosc2 frames (see
    :meth:`frame_check`); a compression that is neither can be written and checked with
    :meth:`decompress_into`, but the reader has no kernel for it.
    """

    compression_id: ClassVar[str]
    #: False when a stored chunk is exactly its raw bytes (no HDF5 filter, no compress step).
    compressed: ClassVar[bool] = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BlockCompression:
        """The object for a config whose ``"id"`` is this class's; raises :class:`CodecError`."""
        params = {k: v for k, v in config.items() if k != "id"}
        try:
            return cls(**params)
        except TypeError as exc:
            raise CodecError(
                f"bad configuration for block compression {cls.compression_id!r}: {exc}"
            ) from exc

    def get_config(self) -> dict[str, Any]:
        """The JSON-serialisable config stored in the file: ``"id"`` and the dataclass fields."""
        fields: tuple[dataclasses.Field, ...] = (
            dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        )
        return {
            "id": self.compression_id,
            **{f.name: getattr(self, f.name) for f in fields if f.init},
        }

    @abc.abstractmethod
    def hdf5_filter_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for h5py's ``create_dataset`` that declare the HDF5 filter (``{}``
        for none), so that h5py (with ``hdf5plugin``) and PyTables read the chunks too."""

    @abc.abstractmethod
    def compress(self, raw: Any, *, typesize: int) -> Any:
        """The stored chunk (a bytes-like object) for ``raw``, one chunk's bytes (bytes-like,
        not modified). ``typesize`` is the element size for byte shuffling (1 for the heap)."""

    @abc.abstractmethod
    def decompress_into(self, stored: Any, out: np.ndarray) -> None:
        """Decode one stored chunk into ``out`` (C-contiguous, exactly the chunk's raw size);
        raises :class:`~rowstore.errors.FormatError` for a chunk that does not decode to it."""

    @abc.abstractmethod
    def frame_check(self) -> tuple[int, int] | None:
        """``None`` when stored chunks are raw bytes, else ``(compcode, shuffle_code)`` of the
        Blosc2 frames (:data:`BLOSC2_CODECS`, :data:`BLOSC2_SHUFFLES`): what the
        read kernel accepts in a chunk header."""


@dataclass(frozen=True)
class NoCompression(BlockCompression):
    """Chunks stored as their raw bytes (``{"id": "none"}``)."""

    compression_id = "none"
    compressed = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BlockCompression:
        return cls()  # other keys beside "id" have always been ignored for "none"

    def hdf5_filter_kwargs(self) -> dict[str, Any]:
        return {}

    def compress(self, raw: Any, *, typesize: int) -> Any:
        return raw

    def decompress_into(self, stored: Any, out: np.ndarray) -> None:
        src = np.frombuffer(stored, np.uint8)
        if src.size != out.nbytes:
            raise FormatError(f"uncompressed chunk of {src.size} bytes, expected {out.nbytes}")
        out.reshape(-1).view(np.uint8)[:] = src

    def frame_check(self) -> None:
        return None


@dataclass(frozen=True, kw_only=True)
class Blosc2(BlockCompression):
    """Each chunk is a single-chunk Blosc2 frame: what HDF5 filter 32026 (PyTables, hdf5plugin)
    stores, built and decoded by ``rowstore.kernels`` without the GIL.

    Parameters
    ----------
    cname : str
        One of :data:`BLOSC2_CODECS` (default ``"lz4"``).
    clevel : int
        0..9 (default 5).
    shuffle : str
        One of :data:`BLOSC2_SHUFFLES` (default ``"byte"``).
    """

    compression_id = "blosc2"
    cname: str = "lz4"
    clevel: int = 5
    shuffle: str = "byte"

    def __post_init__(self) -> None:
        cname, clevel, shuffle = self.cname, self.clevel, self.shuffle
        if not isinstance(cname, str) or cname not in BLOSC2_CODECS:
            raise CodecError(
                f"unknown blosc2 codec {cname!r}; expected one of {tuple(BLOSC2_CODECS)}"
            )
        if not isinstance(clevel, int) or not 0 <= clevel <= 9:
            raise CodecError(f"compression level must be an int in 0..9, got {clevel!r}")
        if not isinstance(shuffle, str) or shuffle not in BLOSC2_SHUFFLES:
            raise CodecError(f"shuffle must be one of {tuple(BLOSC2_SHUFFLES)}, got {shuffle!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BlockCompression:
        unknown = sorted(k for k in config if k not in ("id", "cname", "clevel", "shuffle"))
        if unknown:
            raise CodecError(f"unknown compression option(s) {unknown}")
        return super().from_config(config)

    def hdf5_filter_kwargs(self) -> dict[str, Any]:
        import hdf5plugin

        # hdf5plugin's filter codes are blosc2.h's, as in BLOSC2_SHUFFLES.
        cname: Any = self.cname  # one of hdf5plugin's names: checked against BLOSC2_CODECS
        return dict(
            hdf5plugin.Blosc2(
                cname=cname, clevel=self.clevel, filters=BLOSC2_SHUFFLES[self.shuffle]
            )
        )

    def compress(self, raw: Any, *, typesize: int) -> np.ndarray:
        """The chunk compressed, or stored memcpy'd when that saves less than
        :data:`BLOSC2_MIN_SAVING` of its raw size (still one Blosc2 frame of this codec)."""
        compcode, shuffle = self.frame_check()
        frame = kernels.compress_frame(
            raw, compcode=compcode, clevel=self.clevel, shuffle=shuffle, typesize=typesize
        )
        # The chunk's own sizes (its header at the frame's header length, bytes 11..14): the
        # frame's fixed ~200 bytes of header and trailer are the same either way.
        h = int.from_bytes(frame[11:15].tobytes(), "big")
        nbytes = int.from_bytes(frame[h + 4 : h + 8].tobytes(), "little")
        cbytes = int.from_bytes(frame[h + 12 : h + 16].tobytes(), "little")
        if self.clevel and cbytes > (1 - BLOSC2_MIN_SAVING) * nbytes:
            frame = kernels.compress_frame(
                raw, compcode=compcode, clevel=0, shuffle=shuffle, typesize=typesize
            )
        return frame

    def decompress_into(self, stored: Any, out: np.ndarray) -> None:
        kernels.decompress_frame(
            np.frombuffer(stored, np.uint8),
            out.reshape(-1).view(np.uint8),
            codec=self.frame_check(),
        )

    def frame_check(self) -> tuple[int, int]:
        return BLOSC2_CODECS[self.cname], BLOSC2_SHUFFLES[self.shuffle]


# -- the registry ----------------------------------------------------------------------------
_REGISTRY: dict[str, type[BlockCompression]] = {}


def register_block_compression(
    cls: type[BlockCompression], *, replace: bool = False
) -> type[BlockCompression]:
    """Register a :class:`BlockCompression` subclass under its ``compression_id`` (usable as a
    decorator). Registering another class under a taken id needs ``replace=True``."""
    return add_to_registry(
        _REGISTRY,
        cls,
        base=BlockCompression,
        id_attr="compression_id",
        what="block compression",
        replace=replace,
    )


def registered_block_compressions() -> dict[str, type[BlockCompression]]:
    """The registered block compressions by id (a copy)."""
    return dict(_REGISTRY)


def block_compression(spec_or_config: Any) -> BlockCompression:
    """The block compression for the writer's ``compression=`` argument or a stored config.

    ``None``, ``False`` or ``"none"``: uncompressed. A Blosc2 codec name (``"lz4"``, ``"zstd"``,
    ...): Blosc2 with that codec and the defaults. A dict: a config, ``"id"`` defaulting to
    ``"blosc2"`` (``{"cname": "zstd", "clevel": 5, "shuffle": "byte"}``). A
    :class:`BlockCompression`: itself. Anything else raises :class:`CodecError`.
    """
    x = spec_or_config
    if isinstance(x, BlockCompression):
        return x
    if x is None or x is False or x == "none":
        return NoCompression()
    if isinstance(x, str):
        x = {"id": "blosc2", "cname": x}
    if not isinstance(x, dict):
        raise CodecError(
            f"compression must be None, a codec name {tuple(BLOSC2_CODECS)} or a dict, got {x!r}"
        )
    cid = x.get("id", "blosc2")
    cls = _REGISTRY.get(cid) if isinstance(cid, str) else None
    if cls is None:
        ids = [repr(k) for k in _REGISTRY]
        expected = ", ".join(ids[:-1]) + " or " + ids[-1] if len(ids) > 1 else ids[0]
        raise CodecError(f"unknown block compression {cid!r}; expected {expected}")
    return cls.from_config(x)


def compression_config(compression: Any) -> dict[str, Any]:
    """Normalise the ``compression=`` argument of the writer (or a stored config) into the
    stored config: ``block_compression(compression).get_config()``; see
    :func:`block_compression` for the accepted forms."""
    return block_compression(compression).get_config()


for _cls in (NoCompression, Blosc2):
    register_block_compression(_cls)
del _cls
