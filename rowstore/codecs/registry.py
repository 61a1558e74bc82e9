"""The one registry of codecs: built-ins are registered in ``rowstore.codecs.__init__``, third
parties with :func:`register_codec` or the ``rowstore.codecs`` entry-point group."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

from rowstore.codecs.abc import Codec
from rowstore.errors import CodecError

__all__ = ["register_codec", "get_codec", "registered_codecs", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "rowstore.codecs"


def add_to_registry(
    registry: dict[str, type],
    cls: Any,
    *,
    base: type,
    id_attr: str,
    what: str,
    replace: bool = False,
) -> Any:
    """Enter ``cls`` (a ``base`` subclass) in ``registry`` under its ``id_attr``; refuse a second
    class under a taken id unless ``replace``. The rule of every rowstore registry (codecs here,
    block compressions in ``rowstore.codecs.blocks``)."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise CodecError(f"{cls!r} is not a {base.__name__} subclass")
    cid = getattr(cls, id_attr, None)
    if not isinstance(cid, str) or not cid:
        raise CodecError(f"{cls.__name__} has no {id_attr}")
    if cid in registry and registry[cid] is not cls and not replace:
        raise CodecError(
            f"{what} id {cid!r} is already registered by {registry[cid].__name__}", codec=cid
        )
    registry[cid] = cls
    return cls


_REGISTRY: dict[str, type[Codec]] = {}
_entry_points_loaded = False


def register_codec(cls: type[Codec], *, replace: bool = False) -> type[Codec]:
    """Register a :class:`Codec` subclass under its ``codec_id`` (usable as a decorator)."""
    return add_to_registry(
        _REGISTRY, cls, base=Codec, id_attr="codec_id", what="codec", replace=replace
    )


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            register_codec(ep.load())
        except Exception as exc:  # a broken plugin must not break built-in codecs
            import warnings

            warnings.warn(
                f"rowstore: could not load codec entry point {ep.name!r}: {exc}", stacklevel=2
            )


def registered_codecs() -> dict[str, type[Codec]]:
    _load_entry_points()
    return dict(_REGISTRY)


def default_codec_id(dtype: Any) -> str:
    if dtype == "str":
        return "utf8"
    if dtype == "bytes":
        return "bytes"
    return "raw"


def get_codec(spec: Any, *, dtype: Any = None, field: str | None = None) -> Codec:
    """A codec instance from ``None`` (the dtype's default), an id, a config dict or a Codec."""
    if isinstance(spec, Codec):
        return spec
    if spec is None:
        spec = default_codec_id(dtype)
    if isinstance(spec, str):
        spec = {"id": spec}
    elif isinstance(spec, Mapping):
        spec = dict(spec)  # also a Field's read-only codec mapping
    if not isinstance(spec, dict) or not isinstance(spec.get("id"), str):
        raise CodecError(
            f"field {field!r}: codec must be an id, a config dict with 'id', or a Codec; got "
            f"{spec!r}",
            field=field,
        )
    cid = spec["id"]
    if cid not in _REGISTRY:
        _load_entry_points()
    if cid not in _REGISTRY:
        raise CodecError(
            f"field {field!r}: unknown codec {cid!r}; registered: {sorted(_REGISTRY)} (a "
            f"third-party "
            f"codec must be installed and registered under the {ENTRY_POINT_GROUP!r} entry points)",
            codec=cid,
            field=field,
        )
    try:
        return _REGISTRY[cid].from_config(spec)
    except TypeError as exc:
        raise CodecError(
            f"field {field!r}: bad configuration for codec {cid!r}: {exc}", codec=cid, field=field
        ) from exc
