"""The codec contract.

A codec is a small, frozen, JSON-configurable object that says how one field's values are
stored. Its configuration (``get_config()``) is stored in the file beside the field, so a file
says how to read itself.

Two placements exist:

* **inline** codecs (``inline = True``) store a fixed number of bytes inside the row itself; the
  compiled reader copies those bytes, no Python runs per value;
* **heap** codecs store a variable-size payload in the file's heap; the row holds
  ``(offset, nbytes)`` and, for variable shapes, the variable dimensions. ``encode`` produces the
  payload, ``decode_into`` writes a payload into a caller-owned array.

Third-party codecs subclass :class:`Codec` and are registered with
:func:`rowstore.codecs.register_codec` or under the ``rowstore.codecs`` entry-point group.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rowstore.errors import CodecError

if TYPE_CHECKING:
    from rowstore.schema import Field

__all__ = ["Codec"]


class Codec(abc.ABC):
    """Base class of every codec.

    Subclasses set ``codec_id`` and ``inline``, accept their configuration as keyword arguments
    (JSON-serialisable values only) and implement :meth:`encode` and :meth:`decode_into`.
    Instances are immutable and compare equal when their configurations are equal.
    """

    codec_id: ClassVar[str]
    inline: ClassVar[bool] = False
    #: Whether decode_into releases the GIL for most of its work (threads help when True).
    releases_gil: ClassVar[bool] = True

    def __init__(self, **config: Any):
        if config:
            raise CodecError(
                f"codec {self.codec_id!r} takes no options, got {sorted(config)}", codec=self.codec_id
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
        return hash(tuple(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is immutable")
        super().__setattr__(name, value)

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    # -- the contract ------------------------------------------------------------------------
    @abc.abstractmethod
    def check_field(self, field: Field) -> None:
        """Raise :class:`~rowstore.errors.SchemaError` if this codec cannot store ``field``."""

    def check_value(self, value: Any, field: Field) -> None:  # noqa: B027 - optional hook
        """Codec-specific limits on one (already dtype/shape-checked) value; raise
        :class:`~rowstore.errors.CodecError` to reject it. Default: no extra limits."""

    @abc.abstractmethod
    def encode(self, value: Any, field: Field) -> bytes | memoryview:
        """The stored payload of one value (heap codecs). ``value`` was already validated
        against the field: an ``ndarray`` of the field's dtype and shape, ``str`` or ``bytes``."""

    @abc.abstractmethod
    def decode_into(self, src: memoryview | np.ndarray, out: np.ndarray) -> None:
        """Decode one payload into ``out`` (an array of the value's exact shape and dtype)."""

    def decode(self, src: memoryview | np.ndarray, shape: tuple[int, ...], field: Field) -> Any:
        """Decode one payload into a new value of ``shape`` (allocates; readers use decode_into)."""
        out = np.empty(shape, dtype=field.numpy_dtype)
        self.decode_into(src, out)
        return out
