"""Progress of a shuffle pass: a tqdm bar of bytes with rows/s beside it, or nothing.

tqdm is optional (``rowstore[bench]``): without it a line per second goes to stderr.
"""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """Counts rows and bytes of one pass; shows them when ``enabled``. ``unit``: what a row
    is called (``"files"`` for the image and audio ingests); ``total_rows``: the bar counts
    rows against it rather than bytes (for a pass whose bytes are not known ahead). As a
    context manager it closes the bar on exit."""

    def __init__(
        self,
        desc: str,
        total_bytes: int,
        *,
        enabled: bool,
        unit: str = "rows",
        total_rows: int | None = None,
    ):
        self.desc = desc
        self.unit = unit
        self.total_bytes = total_bytes
        self.total_rows = total_rows
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
                by_rows = total_rows is not None
                self._bar = tqdm(
                    total=total_rows if by_rows else total_bytes,
                    desc=desc,
                    unit=f" {unit}" if by_rows else "B",
                    unit_scale=not by_rows,
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
            self._bar.update(rows if self.total_rows is not None else nbytes)
            if now - self._last > 0.2:
                self._bar.set_postfix_str(
                    f"{self.rows:,} {self.unit}, {rate:,.0f} {self.unit}/s", refresh=False
                )
                self._last = now
        elif now - self._last > 1.0:
            self._last = now
            speed = self.nbytes / max(now - self.t0, 1e-9)
            if self.total_rows is not None:
                left = max(0, self.total_rows - self.rows) / rate if rate > 0 else 0.0
            else:
                left = max(0, self.total_bytes - self.nbytes) / speed if speed > 0 else 0.0
            print(
                f"{self.desc}: {self.rows:,} {self.unit}, {self.nbytes / 2**20:,.1f} MiB, "
                f"{rate:,.0f} {self.unit}/s, {speed / 2**20:,.1f} MiB/s, ETA {left:,.0f} s",
                file=sys.stderr,
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"{self.rows:,} {self.unit}, {self.rows / max(self.seconds, 1e-9):,.0f} "
                f"{self.unit}/s",
                refresh=False,
            )
            self._bar.close()
            self._bar = None
