"""rowstore as a training script consumes it: numpy batches, torch loaders, tf.data.

torch and tensorflow are imported here lazily, only for the modes that use them (and only in the
bench child process that measures that mode).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from importlib.util import find_spec
from typing import Any

from rowstore.bench._source import MODES, Source, uniform_order, var_dims_of
from rowstore.errors import RowstoreError
from rowstore.format.shards import DatasetLayout
from rowstore.reader import Reader
from rowstore.reader import order as _order

__all__ = ["rowstore_source", "check_mode", "ModeUnavailableError"]


class ModeUnavailableError(RowstoreError, ImportError):
    """A bench mode whose framework (torch, tensorflow) is not importable."""


_MODULES = {"torch": "rowstore.torch", "torch-batched": "rowstore.torch", "tf": "rowstore.tf"}
_FRAMEWORK = {"torch": "torch", "torch-batched": "torch", "tf": "tensorflow"}


def _import_adapter(mode: str):
    try:
        return importlib.import_module(_MODULES[mode])
    except ModuleNotFoundError as exc:
        raise ModeUnavailableError(
            f"--mode {mode} needs {_FRAMEWORK[mode]} ({exc}); install it, e.g. pip install "
            f"'rowstore[{_FRAMEWORK[mode].replace('tensorflow', 'tf')}]'"
        ) from exc


def check_mode(mode: str) -> None:
    """Raise :class:`ModeUnavailableError` with a clear message when ``mode`` cannot run here.

    Cheap for numpy; for the framework modes it locates the framework without importing it.
    """
    if mode == "numpy":
        return
    if mode not in _MODULES:
        raise ValueError(f"unknown mode {mode!r}; expected numpy, torch, torch-batched or tf")
    if find_spec(_FRAMEWORK[mode]) is None:
        raise ModeUnavailableError(
            f"--mode {mode} needs {_FRAMEWORK[mode]}, which is not installed"
        )


def rowstore_source(layout: DatasetLayout, names: list[str], opts: dict[str, Any]):
    """A :class:`~rowstore.bench.sources.Source` reading through rowstore in ``opts["mode"]``."""
    mode = opts.get("mode", "numpy")
    B = opts["batch_size"]
    threads = opts.get("threads") or None
    shuffle, seed = opts.get("shuffle", "block"), opts.get("seed", 0)
    # opts["path"], not layout.path: that of a list of paths is their names joined, not a path.
    remote = (
        {"storage_options": opts["storage_options"]}
        if opts.get("storage_options") is not None
        else {}
    )
    reader = Reader(
        opts["path"], verify=opts.get("verify", True), num_threads=threads, **remote
    )  # a fresh reader
    threads = reader.num_threads
    # The window and pieces the reader uses (None: its defaults for this file).
    window, pieces = reader.order_defaults(shuffle, opts.get("window"), opts.get("pieces"))
    label = f"rowstore {shuffle}"
    if mode != "numpy":
        label = f"rowstore {mode} {shuffle}"
    label += f" B={B} t={threads}" + (
        f" W={window}" + (f" P={pieces}" if pieces > 1 else "") if shuffle == "block" else ""
    )
    verify = opts.get("verify", True)
    info: dict[str, Any] = {
        "threads": threads,
        "checks": "always" if verify == "always" else "on" if verify else "off",
    }
    extra_close: list = []

    def quality() -> float:
        return reader.shuffle_quality(B, shuffle=shuffle, seed=seed, window=window, pieces=pieces)

    if mode == "numpy":

        def epoch(k: int) -> Iterator[dict]:
            return reader.batches(
                B,
                shuffle=shuffle,
                seed=seed,
                epoch=k,
                window=window,
                pieces=pieces,
                fields=names,
                num_threads=threads,
            )

    elif mode == "tf":
        rtf = _import_adapter("tf")
        kw = dict(
            batch_size=B,
            shuffle=shuffle,
            seed=seed,
            fields=names,
            window=window,
            pieces=pieces,
            num_threads=threads,
            num_epochs=1,
        )

        def epoch(k: int) -> Iterator[dict]:
            return iter(rtf.make_dataset(reader, epoch=k, **kw))

    elif mode == "torch-batched":
        rt = _import_adapter("torch-batched")
        loader = rt.BatchedDataLoader(
            reader,
            batch_size=B,
            shuffle=shuffle,
            seed=seed,
            fields=names,
            num_threads=threads,
            window=window,
            pieces=pieces,
        )
        extra_close.append(loader.close)

        def epoch(k: int) -> Iterator[dict]:
            loader.set_epoch(k)
            return iter(loader)

    elif mode == "torch":
        rt = _import_adapter("torch")
        from torch.utils.data import DataLoader

        workers = int(opts.get("workers") or 0)
        ds = rt.Dataset(reader, fields=names)
        dl_kw: dict[str, Any] = {
            "batch_size": B,
            "num_workers": workers,
            "shuffle": shuffle != "none",
            "collate_fn": rt.collate,
        }
        if workers:
            dl_kw["persistent_workers"] = False
        info["workers"] = workers
        # DataLoader(shuffle=True) draws a uniform permutation (RandomSampler): quality ~1.
        order_s = "uniform" if shuffle != "none" else "none"
        label = f"rowstore torch Dataset+DataLoader {order_s} B={B} workers={workers}"

        def quality() -> float:  # noqa: F811 - the DataLoader's sampler sets the order here
            if shuffle == "none":
                return reader.shuffle_quality(B, shuffle="none")
            # shuffle_quality takes row ids (id // rows_per_block is the block), not row numbers:
            # they differ on a dataset whose shards have partial or smaller blocks.
            ids = reader.layout.ids(uniform_order(len(reader), seed, 0))
            return _order.shuffle_quality(
                ids, reader.layout.rows_per_block, reader.layout.num_blocks, B
            )

        def epoch(k: int) -> Iterator[dict]:
            import torch

            g = torch.Generator()
            g.manual_seed(seed * 1_000_003 + k)
            return iter(DataLoader(ds, generator=g, **dl_kw))

    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")

    closers = [reader.close] + extra_close

    def close() -> None:
        for c in closers:
            c()

    return Source(
        label=label,
        description=MODES[mode],
        names=names,
        epoch=epoch,
        shuffle_quality=quality,
        num_batches=reader.num_batches(B),
        info=info,
        close=close,
        var_dims=var_dims_of(reader.schema.select(names)),
    )
