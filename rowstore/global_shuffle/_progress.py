"""Progress of a shuffle pass: a tqdm bar of bytes with rows/s beside it, or nothing.

tqdm is optional (``rowstore[bench]``): without it a line per second goes to stderr.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """Counts rows and bytes of one pass; shows them when ``enabled``."""

    def __init__(self, desc: str, total_bytes: int, *, enabled: bool):
        self.desc = desc
        self.rows = 0
        self.nbytes = 0
        self.t0 = time.perf_counter()
        self._bar = None
        self._last = self.t0
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(
                    total=total_bytes,
                    desc=desc,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    dynamic_ncols=True,
                    file=sys.stderr,
                    leave=True,
                )

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def update(self, rows: int, nbytes: int) -> None:
        self.rows += rows
        self.nbytes += nbytes
        if not self.enabled:
            return
        now = time.perf_counter()
        rate = self.rows / max(now - self.t0, 1e-9)
        if self._bar is not None:
            self._bar.update(nbytes)
            if now - self._last > 0.2:
                self._bar.set_postfix_str(f"{rate:,.0f} rows/s", refresh=False)
                self._last = now
        elif now - self._last > 1.0:
            self._last = now
            print(
                f"{self.desc}: {self.rows:,} rows, {self.nbytes / 2**20:,.1f} MiB, {rate:,.0f} "
                f"rows/s, "
                f"{self.nbytes / 2**20 / max(now - self.t0, 1e-9):,.1f} MiB/s",
                file=sys.stderr,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"{self.rows / max(self.seconds, 1e-9):,.0f} rows/s", refresh=False
            )
            self._bar.close()
            self._bar = None
