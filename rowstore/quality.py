"""How ordered a dataset is: figures a user reads before training, to see whether it needs a
global shuffle (:func:`rowstore.shuffle`).

* ``spearman``: the rank correlation of a field with the row position (1 or -1: sorted by
  it; about 0: no trend). Default field: the first scalar numeric field.
* ``batch_spread``: the mean standard deviation of that field inside batches of
  ``batch_size`` consecutive rows of an epoch, over the field's standard deviation in the whole
  dataset (about 1: every batch is as varied as the dataset; near 0: batches hold similar
  rows), for the stored order (``"none"``) and for a block-shuffled epoch (``"block"``).
* ``block_mixing``: :meth:`rowstore.reader.Reader.shuffle_quality` for a block-shuffled epoch
  (how many blocks a batch draws from, against a uniform shuffle).

Large datasets are sampled: ``max_rows`` evenly spaced rows for the correlation, at most
``max_batches`` batches for the spread.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import numpy as np

from rowstore.errors import SchemaError
from rowstore.reader.dataset import Reader, as_reader
from rowstore.schema import Schema

__all__ = ["OrderQuality", "order_quality", "spearman", "default_field"]


@dataclass(frozen=True)
class OrderQuality:
    """Order figures of one dataset (see the module docstring); ``None`` where not computable
    (no numeric field, fewer than two rows)."""

    path: str
    rows: int
    field: str | None
    spearman: float | None
    batch_size: int
    window: int
    batch_spread: dict
    block_mixing: float | None
    pieces: int = 1

    def text(self) -> str:
        f = "-" if self.spearman is None else f"{self.spearman:+.3f}"
        spread = (
            ", ".join(f"{k} {v:.3f}" for k, v in self.batch_spread.items() if v is not None) or "-"
        )
        mix = "-" if self.block_mixing is None else f"{self.block_mixing:.3f}"
        unit = f"window {self.window}" + (f", pieces {self.pieces}" if self.pieces > 1 else "")
        what = f"field {self.field!r}" if self.field else "no scalar numeric field"
        rows = [
            ("rank correlation with position (Spearman)", f, "|1|: sorted, ~0: no trend"),
            (f"batch spread, batch {self.batch_size}", spread, "1: batches as varied as the data"),
            (f"block shuffle mixing, {unit}", mix, "1: as mixed as a uniform shuffle"),
        ]
        return "\n".join(
            [f"{self.path}: {self.rows:,} rows; {what}"]
            + [f"  {a:<44}{b:<24}({c})" for a, b, c in rows]
        )


def default_field(schema: Schema) -> str | None:
    """The first scalar numeric field (int, uint or float, raw codec), or None."""
    for f in schema:
        if (
            f.shape == ()
            and f.inline
            and f.codec["id"] == "raw"
            and np.dtype(f.dtype).kind in "iuf"
        ):
            return f.name
    return None


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks (0-based) with ties averaged."""
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a), np.float64)
    r[order] = np.arange(len(a), dtype=np.float64)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(inv, weights=r) / counts)[inv]


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rank correlation of two 1-D arrays (None when either is constant)."""
    rx, ry = _ranks(np.asarray(x)), _ranks(np.asarray(y))
    rx -= rx.mean()
    ry -= ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return None if den == 0 else float((rx * ry).sum() / den)


def _spread(
    r: Reader, field: str, order: np.ndarray, batch_size: int, max_batches: int, sd: float
) -> float | None:
    nb = len(order) // batch_size
    if nb == 0 or sd == 0:
        return None
    pick = np.linspace(0, nb - 1, min(nb, max_batches)).astype(np.int64)
    rows = (pick[:, None] * batch_size + np.arange(batch_size)[None, :]).reshape(-1)
    vals = np.asarray(r.take(order[rows], fields=[field])[field], np.float64).reshape(
        len(pick), batch_size
    )
    return float(np.nanmean(vals.std(axis=1)) / sd)


def order_quality(
    path: str | os.PathLike | Reader,
    *,
    field: str | None = None,
    batch_size: int = 64,
    window: int | None = None,
    seed: int = 0,
    max_rows: int = 1_000_000,
    max_batches: int = 256,
    storage_options: dict | None = None,
    pieces: int | None = None,
) -> OrderQuality:
    """Order figures of the file or dataset at ``path`` (see :class:`OrderQuality`; a URL with
    ``storage_options`` as for :func:`rowstore.open`; or an open :class:`Reader`, left open);
    ``window`` and ``pieces`` are the block shuffle's (:meth:`Reader.batches
    <rowstore.reader.Reader.batches>`; None: the defaults the reader resolves for the file,
    which the result reports).

    ``field`` must be a scalar numeric field (default: :func:`default_field`). Reads at most
    ``max_rows + max_batches * batch_size * 2`` values of that field.
    """
    opened, own = as_reader(path, storage_options)  # a path, or an open Reader (left open)
    with opened if own else contextlib.nullcontext(opened) as r:
        window, pieces = r.order_defaults("block", window, pieces)
        n = len(r)
        name = default_field(r.schema) if field is None else field
        if name is not None:
            if name not in r.schema:
                raise SchemaError(
                    f"quality: no field {name!r}; the schema has {r.schema.names}", field=name
                )
            f = r.schema[name]
            if f.shape != () or not f.inline or np.dtype(f.dtype).kind not in "iufb":
                raise SchemaError(
                    f"quality: field {name!r} is {f.dtype}{f.shape}; expected a scalar numeric "
                    f"field",
                    field=name,
                )
        rho = sd = None
        spread: dict = {}
        if name is not None and n >= 2:
            pos = np.unique(np.linspace(0, n - 1, min(n, max_rows)).astype(np.int64))
            vals = np.asarray(r.take(pos, fields=[name])[name], np.float64)
            rho = spearman(pos, vals)
            sd = float(np.nanstd(vals))
            spread["none"] = _spread(
                r, name, np.arange(n, dtype=np.int64), batch_size, max_batches, sd
            )
            block = r.epoch_order(shuffle="block", seed=seed, epoch=0, window=window, pieces=pieces)
            spread["block"] = _spread(
                r, name, np.asarray(block, np.int64), batch_size, max_batches, sd
            )
        mixing = (
            r.shuffle_quality(batch_size, shuffle="block", window=window, pieces=pieces)
            if n >= batch_size
            else None
        )
        return OrderQuality(
            r.path if isinstance(path, Reader) else os.fspath(path),
            n,
            name,
            rho,
            batch_size,
            window,
            spread,
            mixing,
            pieces,
        )
