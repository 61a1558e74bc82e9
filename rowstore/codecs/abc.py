"""The codec contract.

A codec is a small, frozen, JSON-configurable object that says how one field's values are
stored and read back. Its configuration (``get_config()``) is stored in the file beside the
field, so a file says how to read itself.

A codec decides two things:

* **placement**, by :meth:`Codec.stored_nbytes`: an int is the fixed number of bytes a value
  takes *inside its row* (row orientation: read with the row, no second range); ``None`` puts
  each value's payload in the file's heap, the row holding ``(offset, nbytes)`` and, for
  variable shapes, the variable dimensions;
* **decoding**, by :meth:`Codec.decode_batch`: one call per batch and field, into an array the
  reader allocated (or the caller's ``out=``). The default loops over the values and calls
  :meth:`Codec.decode_into`, so a simple codec implements only that; a codec with a faster
  whole-column path overrides ``decode_batch``.

A codec may also take values already in its stored form (``accepts_encoded = True``: the image
codecs take PNG/JPEG bytes). :meth:`Codec.inspect_encoded` reads such a value's shape and dtype
from its header, cheaply and without decoding; the writer checks them against the field and
stores the bytes unchanged (an :class:`Encoded` value).

A codec whose stored bytes *are* the value's little-endian bytes sets ``raw_bytes = True``
(only :class:`~rowstore.codecs.raw.Raw` does): the reader's kernels then copy those bytes
straight into the batch arrays and nothing is decoded. A codec whose ``decode_into`` releases
the GIL sets ``releases_gil = True``: the reader then decodes a batch on several threads; one
whose ``encode`` does sets ``encode_releases_gil = True``: the writer then encodes a batch's
values on several threads (``Writer(threads=...)``).

Third-party codecs subclass :class:`Codec` and are registered with
:func:`rowstore.codecs.register_codec` or under the ``rowstore.codecs`` entry-point group.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from rowstore.errors import CodecError

__all__ = ["Codec", "Encoded", "FieldLike", "Payloads", "ParallelMap"]


class FieldLike(Protocol):
    """What a codec reads of a field: :class:`rowstore.schema.Field` is one."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> Any: ...  # a numpy dtype-like, "str" or "bytes"
    @property
    def shape(self) -> tuple[int | None, ...]: ...
    @property
    def is_variable(self) -> bool: ...
    @property
    def numpy_dtype(self) -> np.dtype: ...
    @property
    def fixed_nbytes(self) -> int: ...


#: ``parallel(fn, n)`` runs ``fn(lo, hi)`` over disjoint ranges covering ``range(n)`` (maybe on
#: several threads) and returns when all are done.
ParallelMap = Callable[[Callable[[int, int], None], int], None]


def serial(fn: Callable[[int, int], None], n: int) -> None:
    """The :data:`ParallelMap` that runs everything on the calling thread."""
    fn(0, n)


@dataclass(frozen=True)
class Payloads:
    """The stored values of one field for one batch, as the reader hands them to a codec.

    Attributes
    ----------
    data : ndarray of uint8
        Every value's stored bytes, back to back (owned by the reader; read-only for codecs).
    offsets : ndarray of int64, shape (n + 1,)
        Value ``i`` is ``data[offsets[i]:offsets[i + 1]]``.
    shapes : ndarray of int64, shape (n, ndim), or None
        Each value's full shape, for variable-shape fields (None for fixed shapes).
    nulls : ndarray of bool, shape (n,), or None
        True where the value is null (its payload is empty; its output is left to the reader).
    """

    data: np.ndarray
    offsets: np.ndarray
    shapes: np.ndarray | None
    nulls: np.ndarray | None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def payload(self, i: int) -> np.ndarray:
        """Value ``i``'s stored bytes (a view)."""
        return self.data[self.offsets[i] : self.offsets[i + 1]]

    def is_null(self, i: int) -> bool:
        return self.nulls is not None and bool(self.nulls[i])

    def element_offsets(self) -> np.ndarray | None:
        """For variable shapes: value ``i``'s elements are ``[e[i], e[i + 1])`` of the flat
        output (int64, ``n + 1``); None for fixed shapes."""
        if self.shapes is None:
            return None
        e = np.zeros(len(self) + 1, np.int64)
        np.cumsum(np.prod(self.shapes, axis=1), out=e[1:])
        return e


@dataclass(frozen=True, eq=False)
class Encoded:
    """A value given in its codec's stored form (e.g. the bytes of a PNG file), validated: the
    writer stores ``data`` unchanged. ``shape`` and ``dtype`` are those of the decoded value
    (read from its header by :meth:`Codec.inspect_encoded`), so a variable-shape field records
    its dimensions and size limits apply to what a reader will allocate.

    ``data`` is the caller's object (``bytes``, or a byte ``memoryview`` of a bytes-like
    object): it is copied into the file's heap within the ``write``/``write_batch`` call."""

    data: bytes | memoryview
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded value (what a reader allocates for it)."""
        return self.size * self.dtype.itemsize

    @property
    def stored_nbytes(self) -> int:
        return self.data.nbytes if isinstance(self.data, memoryview) else len(self.data)


class Codec(abc.ABC):
    """Base class of every codec.

    Subclasses set ``codec_id``, accept their configuration as keyword arguments
    (JSON-serialisable values only) and implement :meth:`check_field`, :meth:`encode` and
    :meth:`decode_into`; they may override :meth:`stored_nbytes` (fixed-size values stored in
    the row), :meth:`check_value` and :meth:`decode_batch`. Instances are immutable and compare
    equal when their configurations are equal.
    """

    codec_id: ClassVar[str]
    #: The stored bytes are the value's little-endian array bytes (no decode step).
    raw_bytes: ClassVar[bool] = False
    #: ``decode_into`` releases the GIL for most of its work, so threads decode in parallel.
    releases_gil: ClassVar[bool] = False
    #: ``encode`` releases the GIL for most of its work and is thread-safe: the writer encodes
    #: a batch's values on several threads.
    encode_releases_gil: ClassVar[bool] = False
    #: Values may be given already encoded (``bytes``, ``bytearray``, ``memoryview``); see
    #: :meth:`inspect_encoded`.
    accepts_encoded: ClassVar[bool] = False
    #: What the writer's statistics summarize of this codec's values beyond their bytes
    #: (``docs/stats.md``): ``"image"`` (height, width and channels, from each value's shape)
    #: or another name (e.g. ``"audio"``) whose facts :meth:`value_facts` gives per value;
    #: None: nothing.
    stats_kind: ClassVar[str | None] = None

    def __init__(self, **config: Any):
        if config:
            raise CodecError(
                f"codec {self.codec_id!r} takes no options, got {sorted(config)}",
                codec=self.codec_id,
            )

    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable configuration, including ``"id"``."""
        return {"id": self.codec_id}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Codec:
        params = {k: v for k, v in config.items() if k != "id"}
        codec = cls(**params)
        codec._freeze()  # also codecs whose __init__ does not freeze (raw, utf8, bytes)
        return codec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is immutable")
        super().__setattr__(name, value)

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    # -- placement ---------------------------------------------------------------------------
    def stored_nbytes(self, field: FieldLike) -> int | None:
        """Bytes of one value stored inside the row, or ``None`` (the default): each value is a
        payload in the heap. Only fields of fixed shape can be stored in the row."""
        return None

    # -- writing -----------------------------------------------------------------------------
    @abc.abstractmethod
    def check_field(self, field: FieldLike) -> None:
        """Raise :class:`~rowstore.errors.SchemaError` if this codec cannot store ``field``."""

    def check_value(self, value: Any, field: FieldLike) -> None:  # noqa: B027 - optional hook
        """Codec-specific limits on one (already dtype/shape-checked) value; raise
        :class:`~rowstore.errors.CodecError` to reject it. Default: no extra limits."""

    @abc.abstractmethod
    def encode(self, value: Any, field: FieldLike) -> bytes | memoryview | np.ndarray:
        """The stored bytes of one value (exactly ``stored_nbytes(field)`` bytes for values
        stored in the row). ``value`` was already validated against the field: an ``ndarray``
        of the field's dtype and shape, ``str`` or ``bytes``."""

    def inspect_encoded(self, data: memoryview, field: FieldLike) -> tuple[tuple[int, ...], Any]:
        """``(shape, dtype)`` of the value that ``data`` (a value in this codec's stored form,
        as a byte ``memoryview``) decodes to, read cheaply (a header, not a decode), in the
        field's layout (its number of dimensions). Raise :class:`~rowstore.errors.CodecError`
        for bytes that are not such a value or cannot be one of ``field``'s. Only called when
        :attr:`accepts_encoded` is True; the writer then checks shape and dtype against the
        field."""
        raise CodecError(
            f"field {field.name!r}: codec {self.codec_id!r} takes values, not encoded bytes",
            codec=self.codec_id,
            field=field.name,
        )

    def verify_encoded(self, data: memoryview, shape: tuple[int, ...], field: FieldLike) -> None:
        """Decode ``data`` in full into a scratch array of ``shape`` (the writer's
        ``verify_encoded=True``); a :class:`~rowstore.errors.CodecError` if it does not."""
        out = np.empty(shape, dtype=field.numpy_dtype)
        self.decode_into(np.frombuffer(data, np.uint8), out)

    def value_facts(
        self, data: memoryview, shape: tuple[int, ...], field: FieldLike
    ) -> dict[str, int | float] | None:
        """Facts of one stored value for the writer's statistics (:attr:`stats_kind` other
        than ``"image"``): e.g. ``{"sample_rate": 16000, "duration": 1.5}`` read from its
        header, cheaply (no decode); ``shape`` is the value's. At most 16 names; ints are also
        counted by value. Default: none."""
        return None

    def payload(self, value: Any, field: FieldLike) -> bytes | memoryview | np.ndarray:
        """The stored bytes of a validated value: an :class:`Encoded` value's bytes as they are,
        else :meth:`encode`'s."""
        if isinstance(value, Encoded):
            return value.data
        return self.encode(value, field)

    # -- reading -----------------------------------------------------------------------------
    @abc.abstractmethod
    def decode_into(self, src: np.ndarray, out: np.ndarray) -> None:
        """Decode one value's stored bytes ``src`` (uint8) into ``out``: an array of the value's
        exact shape and dtype (a 0-d ``object`` array for ``str``/``bytes`` fields, filled with
        ``out[()] = value``). Raise :class:`~rowstore.errors.CodecError` for bytes that do not
        decode; the reader reports it as a corrupt value with the file, field and row."""

    def decode_batch(self, src: Payloads, out: np.ndarray, parallel: ParallelMap = serial) -> None:
        """Decode a batch's values into ``out``, allocated by the reader (or given by the user):
        ``(n, *shape)`` for fixed shapes, the flat values (``Payloads.element_offsets``) for
        variable shapes, ``(n,)`` of ``object`` for ``str``/``bytes``. Null values are skipped
        (the reader fills them). ``parallel`` may run ranges on several threads (only given
        when :attr:`releases_gil` is True). Default: :meth:`decode_into` value by value."""
        elems = src.element_offsets()

        def run(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                if src.is_null(i):
                    continue
                if elems is None:
                    dst = out[i : i + 1].reshape(out.shape[1:])
                else:
                    assert src.shapes is not None  # set with element offsets
                    dst = out[elems[i] : elems[i + 1]].reshape(tuple(src.shapes[i]))
                self.decode_into(src.payload(i), dst)

        parallel(run, len(src))

    def decode(
        self, src: np.ndarray | bytes | memoryview, shape: tuple[int, ...], field: FieldLike
    ) -> Any:
        """Decode one value into a new object (allocates; readers use :meth:`decode_batch`)."""
        data = np.frombuffer(src, np.uint8) if not isinstance(src, np.ndarray) else src
        out = np.empty(shape, dtype=field.numpy_dtype)
        self.decode_into(data, out)
        return out[()] if out.dtype == object else out
