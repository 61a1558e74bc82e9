"""Benchmarks: ``rowstore-bench`` (:func:`main`) and the measuring core that ``bench/`` uses.

Modules, in import order:

- :mod:`~rowstore.bench.measure`: touching batches, timing repeats, CPU and memory, memcpy;
- :mod:`~rowstore.bench.sources`: what is measured (rowstore, and the h5py / PyTables / numpy
  memmap loaders a user would write by hand), all yielding the same kind of batches;
- :mod:`~rowstore.bench.adapters`: rowstore through numpy, torch and tf.data (lazy imports);
- :mod:`~rowstore.bench.runner`: each configuration in a fresh process (peak RSS per config);
- :mod:`~rowstore.bench.report`: tables, markdown, plots;
- :mod:`~rowstore.bench.cli`: the ``rowstore-bench`` command.

Importing this package imports neither torch, tensorflow nor matplotlib.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rowstore-bench`` console script (see :mod:`rowstore.bench.cli`);
    returns the exit status (130 after Ctrl-C, with one line on stderr)."""
    import sys

    try:
        from rowstore.bench.cli import main as _main

        return _main(argv)
    except KeyboardInterrupt:
        print("rowstore-bench: interrupted", file=sys.stderr)
        return 130
