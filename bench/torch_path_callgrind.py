"""Instruction counts of the torch path's per-batch cost, independent of the load.

Runs ``Reader.batches`` and ``BatchedDataLoader`` epochs (one reader thread, so the counts are
stable) between calls to ``os.getppid``, which callgrind is told to dump before:

    python -c "from rowstore.demo import make_demo; make_demo('tiny', '/tmp/cg_tiny.h5', 100000)"
    valgrind --tool=callgrind --dump-before=getppid --callgrind-out-file=cg.%p \\
        python bench/torch_path_callgrind.py /tmp/cg_tiny.h5 256
    for i in 2 3 4 5 6 7; do grep -m1 ^summary cg.<pid>.$i; done

Dumps 2-7: reader epoch 0, loader epoch 0, reader epoch 1, loader epoch 1, reader + sum of
``x``, loader + sum; divide by the number of batches. Takes ~10-20 minutes under valgrind.
"""

from __future__ import annotations

import os
import sys

import rowstore
import rowstore.torch as rst


def main() -> None:
    path, bs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256
    r = rowstore.open(path, num_threads=1)
    dl = rst.BatchedDataLoader(r, batch_size=bs, seed=0, num_threads=1)

    def reader(e, touch=False):
        for b in r.batches(bs, seed=0, epoch=e, num_threads=1):
            if touch:
                b["x"].sum()

    def loader(e, touch=False):
        dl.set_epoch(e)
        for b in dl:
            if touch:
                b["x"].sum()

    reader(2)
    loader(2)  # warm-up
    os.getppid()
    for e in (0, 1):
        reader(e)
        os.getppid()
        loader(e)
        os.getppid()
    reader(0, True)
    os.getppid()
    loader(0, True)
    os.getppid()


if __name__ == "__main__":
    main()
