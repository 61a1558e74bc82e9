"""What the commands share: numbers and tables in words, opening what a path names, the types
of their arguments and the options several commands take."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rowstore import storage
from rowstore.format.open import open_layout

#: The help of ``--allow-missing-footer``.
LOST_FOOTER = (
    "read a v2 file whose footer is gone (edited with h5py) through libhdf5, "
    "with v1's guarantees only"
)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _n(n: int, noun: str, plural: str | None = None, *, commas: bool = False) -> str:
    """``n`` and ``noun`` in the number's form: ``1 shard file``, ``2 shard files``
    (``commas``: ``1,024``)."""
    number = f"{n:,}" if commas else str(n)
    return f"{number} {noun if n == 1 else plural or noun + 's'}"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def _open_layout(
    path: str,
    storage_options: dict | None = None,
    *,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> tuple[Any, Any]:
    """The layout of the file or dataset at ``path`` (local, ``file://`` or any fsspec URL, as
    :func:`rowstore.open` takes it), and the :class:`~rowstore.storage.location.Location` that
    reads its shards."""
    if storage_options is not None:
        try:
            storage.locate(path, storage_options=storage_options)
        except ValueError:
            raise ValueError(
                f"--storage-options applies to URLs (s3://, http://, file://...); got {path!r}"
            ) from None
    opened = open_layout(
        path,
        storage_options=storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
        pin=False,
    )
    return opened.layout, opened.location


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of rows >= 0, got {n}")
    return n


def _seconds(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return v


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def _unit_frac(text: str) -> float:
    v = float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text}")
    return v


def _json_object(text: str) -> dict:
    try:
        v = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a JSON object, e.g. '{{\"anon\": true}}': {exc}"
        ) from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}")
    return v


def _storage_options_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        type=_json_object,
        default=None,
        help="fsspec options of a URL (credentials, endpoint), e.g. '{\"anon\": true}'",
    )


def _add_outside_links(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-outside-links",
        action="store_true",
        help="follow symlinks (of shards, shards/, _manifests/) that lead out of the "
        "dataset directory (refused by default: a downloaded dataset could point "
        "at any file)",
    )


def _add_missing_footer(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-missing-footer", action="store_true", help=LOST_FOOTER)
