"""Resume states: the one codec every loader's saved state goes through.

:class:`StreamState` is a versioned JSON object that names its dataset (a fingerprint), where
the stream stands (epoch, what remains, the hand-out of the epoch in progress) and the order it
was read in; every field is checked by type and range, refused with
:class:`~rowstore.errors.StateError` naming it. :func:`loads_state` bounds the JSON text (size
and nesting) before parsing it. :class:`rowstore.reader.epochs.EpochStream` writes and loads
these states; the loaders hand them to torch, tf and Grain unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from rowstore.errors import StateError
from rowstore.reader.order import MODES

#: The kind of a dealt epoch's state (every loader's, through ``EpochStream``), and of the
#: former in-memory loader's (a position in its own permutation of the rows it held): still
#: parsed and checked, then refused by kind (no loader resumes it).
STATE_KIND = "rowstore.epoch"
INMEM_KIND = "InMemBatchedDataLoader"
#: The state format written. Version 3 added ``"dataset"``, the dataset's fingerprint.
STATE_VERSION = 3
#: Earlier versions still read (they do not name their dataset: a ``FutureWarning`` says so).
OLD_VERSIONS = {STATE_KIND: 2, INMEM_KIND: 1}
#: Epochs (and batch numbers, rows) a state may hold: below ``2**62``, so that ``epoch + 1``
#: and int64 arithmetic never overflow.
MAX_EPOCH = 1 << 62
#: Bounds of a state read as JSON text (:func:`loads_state`): bytes, and nesting depth.
MAX_STATE_BYTES = 4 << 20
MAX_STATE_DEPTH = 16

#: Order keys added after states were first saved, and the value a state without them was saved
#: with (a state from before ``pieces`` existed is a ``pieces=1`` order).
ORDER_DEFAULTS: dict[str, Any] = {"pieces": 1}

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


def subset_key(keep: np.ndarray | None) -> int | None:
    """A checksum of a row subset (None: all rows), so a state is not resumed on another subset."""
    if keep is None:
        return None
    return zlib.crc32(np.packbits(np.asarray(keep, bool)).tobytes())


def _bad(field: str, expected: str, value: Any) -> StateError:
    got = repr(value)
    got = got if len(got) <= 80 else got[:77] + "..."
    return StateError(
        f"{field} must be {expected}, got {got} ({type(value).__name__}) in a resume state",
        field=field,
    )


def _int(field: str, value: Any, low: int = 0, high: int | None = None) -> int:
    """An int (Python or NumPy; not bool, float or str) in ``[low, high)``."""
    what = {0: "a non-negative int", 1: "a positive int"}.get(low, f"an int >= {low}")
    if high is not None:
        what += " below 2**62" if high == MAX_EPOCH else f" below {high}"
    if (
        not isinstance(value, (int, np.integer))
        or isinstance(value, (bool, np.bool_))
        or value < low
        or (high is not None and value >= high)
    ):
        raise _bad(field, what, value)
    return int(value)


def _opt_int(field: str, value: Any, low: int = 0, high: int | None = None) -> int | None:
    return None if value is None else _int(field, value, low, high)


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _bad(field, "a bool", value)
    return bool(value)


def _seq(field: str, value: Any, what: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise _bad(field, what, value)
    return list(value)


def _pair(field: str, value: Any) -> tuple[int, int]:
    """``[rank, world]`` with ints ``0 <= rank < world``."""
    what = "[rank, world] with ints 0 <= rank < world"
    v = _seq(field, value, what)
    if len(v) != 2:
        raise _bad(field, what, value)
    world = _int(field, v[1], 1, MAX_EPOCH)
    return _int(field, v[0], 0, world), world


def _ranges(field: str, value: Any) -> list[list[int]] | None:
    """None, or sorted disjoint non-empty ``[start, stop)`` ranges of ints."""
    if value is None:
        return None
    what = "None or a list of [start, stop) int pairs, sorted, disjoint, non-empty"
    out: list[list[int]] = []
    last = 0
    for r in _seq(field, value, what):
        r = _seq(field, r, what)
        if len(r) != 2:
            raise _bad(field, what + f" (a range of {len(r)} items)", value)
        a, b = _int(field, r[0], 0, MAX_EPOCH), _int(field, r[1], 0, MAX_EPOCH)
        if b <= a or a < last:
            raise _bad(field, what + f" (at [{a}, {b}))", value)
        out.append([a, b])
        last = b
    return out


def _hand_out(field: str, value: Any) -> dict[str, Any] | None:
    """None, or ``{"world", "lanes", "unit", "steps", "base"}`` (``EpochStream``)."""
    if value is None:
        return None
    keys = ("world", "lanes", "unit", "steps", "base")
    if not isinstance(value, Mapping) or sorted(value) != sorted(keys):
        raise _bad(field, f"None or a dict of {list(keys)}", value)
    out: dict[str, Any] = {k: _int(f"{field}.{k}", value[k], 1, MAX_EPOCH) for k in keys[:3]}
    out["steps"] = _int(f"{field}.steps", value["steps"], 0, MAX_EPOCH)
    out["base"] = _ranges(f"{field}.base", value["base"])
    return out


def _shuffle(field: str, value: Any, kind: str) -> Any:
    if kind == INMEM_KIND:
        return _bool(field, value)
    if not isinstance(value, str) or value not in MODES:
        raise _bad(field, f"one of {MODES}", value)
    return value


def _fingerprint(field: str, value: Any) -> str:
    if not isinstance(value, str) or not _FINGERPRINT.fullmatch(value):
        raise _bad(field, "a dataset fingerprint (16 hex digits)", value)
    return value


#: Each key of a state: how it is checked (``check(key, value, kind)``), and for which kinds.
#: ``order``: compared with the loader's own value when loaded (:meth:`StreamState.check`).
_BOTH, _DEALT, _INMEM = (STATE_KIND, INMEM_KIND), (STATE_KIND,), (INMEM_KIND,)
_FIELDS: dict[str, tuple[Any, tuple[str, ...], bool]] = {
    "dataset_rows": (lambda k, v, _: _int(k, v), _DEALT, True),
    "num_rows": (lambda k, v, _: _int(k, v), _BOTH, True),
    "dataset_version": (lambda k, v, _: _opt_int(k, v), _BOTH, True),
    "dataset": (lambda k, v, _: _fingerprint(k, v), _BOTH, True),
    "seed": (lambda k, v, _: _int(k, v), _BOTH, True),
    "shuffle": (_shuffle, _BOTH, True),
    "window": (lambda k, v, _: _opt_int(k, v, 1), _DEALT, True),
    "pieces": (lambda k, v, _: _opt_int(k, v, 1), _DEALT, True),
    "subset": (lambda k, v, _: _opt_int(k, v, 0, 1 << 32), _DEALT, True),
    "batch_size": (lambda k, v, _: _int(k, v, 1), _BOTH, True),
    "drop_last": (lambda k, v, _: _bool(k, v), _DEALT, True),
    "pad": (lambda k, v, _: _bool(k, v), _DEALT, True),
    "shard": (lambda k, v, _: list(_pair(k, v)), _INMEM, True),
    "even": (lambda k, v, _: _bool(k, v), _INMEM, True),
}
#: The order keys a state of each kind must hold (``ORDER_DEFAULTS`` fill the others).
_ORDER_KEYS = {kind: [k for k, (_, kinds, _) in _FIELDS.items() if kind in kinds] for kind in _BOTH}
#: The other keys: where the stream stands.
_PROGRESS_KEYS = {
    STATE_KIND: ("remaining", "consumer", "taken", "row", "hand_out"),
    INMEM_KIND: ("position", "stop_epoch"),
}


def _depth(text: str) -> int:
    """The deepest nesting of JSON brackets in ``text``, brackets inside strings left out:
    linear time and memory (no regular expression, no recursion)."""
    b = np.frombuffer(text.encode("utf-8", "replace"), np.uint8)
    n = len(b)
    if not n:
        return 0
    pos = np.arange(n, dtype=np.int32)
    last = np.maximum.accumulate(np.where(b == 92, -1, pos))  # last non-backslash up to i
    quotes = np.flatnonzero(b == 34)
    before = np.maximum(quotes - 1, 0)
    escapes = np.where(quotes > 0, before - last[before], 0)  # backslashes right before
    toggle = np.zeros(n, np.int8)
    toggle[quotes[escapes % 2 == 0]] = 1
    outside = (np.cumsum(toggle, dtype=np.int32) & 1) == 0
    step = np.isin(b, (91, 123)).astype(np.int32) - np.isin(b, (93, 125))
    return int(np.cumsum(np.where(outside, step, 0), dtype=np.int32).max())


def loads_state(text: str | bytes, where: str = "state") -> Any:
    """Parse a saved state's JSON text with bounded size (:data:`MAX_STATE_BYTES`) and nesting
    (:data:`MAX_STATE_DEPTH`), so a hostile file cannot exhaust memory or the stack;
    :class:`~rowstore.errors.StateError` naming ``where`` otherwise."""
    if len(text) > MAX_STATE_BYTES:
        raise StateError(
            f"{where}: a saved state of {len(text)} bytes, more than the {MAX_STATE_BYTES} "
            f"a rowstore state may have"
        )
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise StateError(f"{where}: a saved state must be UTF-8 JSON text ({e})") from None
    depth = _depth(text)
    if depth > MAX_STATE_DEPTH:
        raise StateError(
            f"{where}: a saved state nested {depth} levels deep; a rowstore state has at most "
            f"{MAX_STATE_DEPTH}"
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise StateError(f"{where}: not a JSON state ({e})") from None


@dataclasses.dataclass(frozen=True)
class StreamState:
    """A saved position in a resumable epoch stream, checked field by field.

    Every loader's ``state_dict`` (torch's :class:`~rowstore.torch.BatchedDataLoader`,
    ``ResumableDataLoader``, ``IterableDataset``, ``rowstore.tf``'s ``Loader`` and its
    ``tf.train.Checkpoint``, the Grain iterators: ``EpochStream.state_dict``) is
    :meth:`to_json` of one,
    and every ``load_state_dict`` goes through :meth:`from_json` and :meth:`check`, which refuse
    a state with :class:`~rowstore.errors.StateError` naming the field.

    Attributes
    ----------
    kind : str
        :data:`STATE_KIND` (a dealt epoch: the global batches not yet delivered, resumable on
        any world) or :data:`INMEM_KIND` (the former in-memory loader's position, refused).
    epoch : int
        The epoch to read, ``0 <= epoch < 2**62``.
    order : dict
        What the order depends on, compared with the loader's when loaded: ``dataset`` (the
        source's :attr:`~rowstore.reader.Reader.fingerprint`), ``dataset_rows``,
        ``dataset_version`` (a dataset directory's manifest version), ``seed``, ``shuffle``,
        ``batch_size`` and the kind's other order arguments.
    remaining : list of [start, stop) or None
        A dealt epoch's global batches not yet delivered (None: all of them).
    consumer, taken, row
        A torch ``DataLoader`` worker's own progress (``IterableDataset.state_dict`` inside a
        worker): its ``(worker, workers)`` and the rows of the current step taken (its place
        in the hand-out is ``hand_out``).
    hand_out : dict or None
        How the epoch in progress is handed out (``EpochStream``): ``world`` ranks of
        ``lanes`` lanes each, dealt in units of ``unit`` global batches from ``base`` (the
        epoch's global batches not yet delivered when it was dealt, None: all), of which every
        rank handed out ``steps``. A loader of the same world and unit finishes the epoch with
        the identical batch sequence; any other deals ``remaining`` again. A state without one
        is handed out in one lane per rank from ``remaining``.
    position, stop_epoch
        The in-memory loader's rows handed out in ``epoch``, and the epoch its run stops at.
    version : int
        The format read (:data:`STATE_VERSION`; older ones do not name their dataset).
    """

    kind: str
    epoch: int
    order: dict[str, Any]
    remaining: list[list[int]] | None = None
    consumer: tuple[int, int] | None = None
    taken: int = 0
    row: int = 0
    position: int = 0
    stop_epoch: int | None = None
    version: int = STATE_VERSION
    hand_out: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The state as plain JSON values (``json``, ``torch.save`` and ``tf`` friendly)."""
        out: dict[str, Any] = {"kind": self.kind, "version": self.version, "epoch": self.epoch}
        out.update(self.order)
        if self.kind == INMEM_KIND:
            out.update(position=self.position, stop_epoch=self.stop_epoch)
        else:
            out["remaining"] = self.remaining
            if self.hand_out is not None:
                out["hand_out"] = dict(self.hand_out)
            if self.consumer is not None:
                out.update(consumer=list(self.consumer), taken=self.taken, row=self.row)
        return out

    @classmethod
    def from_json(cls, state: Any) -> StreamState:
        """Parse and check a saved state (a mapping of plain values): its kind and version,
        every field's type and range, no unknown field; :class:`StateError` otherwise."""
        if not isinstance(state, Mapping):
            raise StateError(
                f"not a rowstore epoch state: a dict was expected, got {type(state).__name__}"
            )
        kind, version = state.get("kind"), state.get("version")
        if not isinstance(kind, str) or kind not in OLD_VERSIONS:
            raise StateError(
                f"not a rowstore epoch state: 'kind' must be one of {tuple(OLD_VERSIONS)}, "
                f"got {kind!r}",
                field="kind",
            )
        if isinstance(version, bool) or version not in (STATE_VERSION, OLD_VERSIONS[kind]):
            raise StateError(
                f"a {kind!r} state of version {version!r}: this rowstore reads versions "
                f"{OLD_VERSIONS[kind]} and {STATE_VERSION}"
                + (" (it was saved by a newer rowstore)" if _newer(version) else ""),
                field="version",
            )
        progress = _PROGRESS_KEYS[kind]
        known = {"kind", "version", "epoch", *_ORDER_KEYS[kind], *progress}
        unknown = sorted(map(str, set(state) - known))
        if unknown:
            raise StateError(
                f"invalid resume state: unknown field(s) {unknown} in a {kind!r} state "
                f"(its fields are {sorted(known)})",
                field=unknown[0],
            )
        order: dict[str, Any] = {}
        for k in _ORDER_KEYS[kind]:
            if k not in state:
                if k in ORDER_DEFAULTS:
                    order[k] = ORDER_DEFAULTS[k]
                    continue
                if k == "dataset" and version != STATE_VERSION:
                    continue  # an old state: it does not name its dataset
                raise StateError(f"invalid resume state: it has no {k!r}", field=k)
            order[k] = _FIELDS[k][0](k, state[k], kind)
        for k in ("epoch", *progress):
            if k not in state and k not in ("consumer", "taken", "row", "hand_out"):
                raise StateError(f"invalid resume state: it has no {k!r}", field=k)
        epoch = _int("epoch", state["epoch"], 0, MAX_EPOCH)
        if kind == INMEM_KIND:
            return cls(
                kind,
                epoch,
                order,
                position=_int("position", state["position"], 0, MAX_EPOCH),
                stop_epoch=_opt_int("stop_epoch", state["stop_epoch"], 0, MAX_EPOCH),
                version=version,
            )
        consumer = state.get("consumer")
        return cls(
            kind,
            epoch,
            order,
            remaining=_ranges("remaining", state["remaining"]),
            consumer=None if consumer is None else _pair("consumer", consumer),
            taken=_int("taken", state.get("taken", 0), 0, MAX_EPOCH),
            row=_int("row", state.get("row", 0), 0, MAX_EPOCH),
            version=version,
            hand_out=_hand_out("hand_out", state.get("hand_out")),
        )

    def check(
        self,
        expected: Mapping[str, Any],
        *,
        batches: int | None = None,
        positions: int | None = None,
    ) -> None:
        """:class:`StateError` unless the state was saved for the order ``expected`` (the
        loader's own, with its ``dataset`` fingerprint), its ``remaining`` batches lie below
        ``batches`` (the epoch's global batches) and its ``position`` at most ``positions``.

        A state of an earlier version, which does not name its dataset, resumes when all the
        rest matches, with a ``FutureWarning``."""
        for k, v in expected.items():
            if k == "dataset" and "dataset" not in self.order:
                warnings.warn(
                    f"this resume state (version {self.version}) was saved by an older rowstore "
                    f"and does not name its dataset: it resumes because its rows, version and "
                    f"order match, but cannot be checked to be this dataset's. The states saved "
                    f"from now on carry the dataset's fingerprint; a future rowstore will refuse "
                    f"states without one",
                    FutureWarning,
                    stacklevel=4,
                )
                continue
            saved = self.order.get(k, ORDER_DEFAULTS.get(k))
            if saved == v and type(saved) is type(v):
                continue
            if k == "dataset":
                raise StateError(
                    f"cannot resume: the state was saved on another dataset (fingerprint "
                    f"{saved}, this one is {v}) with the same rows and version; a state resumes "
                    f"only on the dataset it was saved on",
                    field=k,
                )
            hint = ""
            if k in ("window", "pieces"):
                hint = (
                    f"; pass {k}={saved!r} (or leave window and pieces to their defaults) to "
                    f"resume it"
                )
            elif k == "dataset_version" and saved is not None:
                hint = (
                    f"; open the version it was saved on (rowstore.open(path, "
                    f"version={saved})) to finish its epoch"
                )
            raise StateError(
                f"cannot resume: the saved state has {k}={saved!r}, this reader {v!r} "
                f"(the epoch order would differ){hint}",
                field=k,
            )
        if batches is not None and self.remaining and self.remaining[-1][1] > batches:
            raise StateError(
                f"invalid resume state: 'remaining' batches {self.remaining} go beyond the "
                f"epoch's {batches} global batches",
                field="remaining",
            )
        if positions is not None and self.position > positions:
            raise StateError(
                f"invalid resume state: 'position' {self.position} is beyond the {positions} "
                f"rows of the epoch",
                field="position",
            )


def _newer(version: Any) -> bool:
    return bool(
        isinstance(version, (int, np.integer))
        and not isinstance(version, bool)
        and version > STATE_VERSION
    )
