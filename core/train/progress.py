"""The progress bar of training, evaluation and data preparation.

On a terminal it is tqdm's bar (tqdm is a dependency). When stderr is not a terminal — a log
file, CI, ``nohup`` — a redrawn bar would become one enormous ``\\r``-joined line, so a ``LineBar``
prints one plain line every ``every`` units instead (and one at the end).
"""
from __future__ import annotations

import sys
import time


class NoBar:
    """A progress bar that shows nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: object) -> None:
        pass

    def write(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class LineBar(NoBar):
    """Progress as log lines: ``step 200/1000 (20%) · loss=1.234 · 812 step/min``, one every
    ``every`` units (and when closed)."""

    def __init__(self, total: int | None, *, unit: str, initial: int = 0, every: int = 1,
                 stream=None) -> None:
        self.total, self.unit, self.n, self.every = total, unit, initial, max(1, every)
        self.stream = stream if stream is not None else sys.stderr
        self.postfix: dict[str, object] = {}
        self.started, self.start_n = time.perf_counter(), initial
        self.printed = initial

    def update(self, n: int = 1) -> None:
        before, self.n = self.n, self.n + n
        if self.n // self.every > before // self.every:
            self._line()

    def set_postfix(self, **kwargs: object) -> None:
        self.postfix = kwargs

    def write(self, message: str) -> None:
        print(message, file=self.stream, flush=True)

    def _line(self) -> None:
        self.printed = self.n
        done = f"{self.n:,}/{self.total:,}" if self.total else f"{self.n:,}"
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.unit} {done}{share}", *(f"{k}={v}" for k, v in self.postfix.items())]
        elapsed = time.perf_counter() - self.started
        if elapsed > 0 and self.n > self.start_n:
            parts.append(_rate((self.n - self.start_n) / elapsed, self.unit))
        print(" · ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        if self.n != self.printed:
            self._line()


def _rate(per_second: float, unit: str) -> str:
    if unit == "B":
        return f"{per_second / 1e6:.1f} MB/s"
    return f"{per_second:.2f} {unit}/s" if per_second >= 1 else f"{per_second * 60:.1f} {unit}/min"


def progress(total: int | None, *, unit: str, initial: int = 0, show: bool = True, leave: bool = True,
             every: int | None = None):
    """A tqdm bar over ``total`` ``unit`` s on a terminal; a ``LineBar`` printing every ``every``
    units (default: a tenth of the total) when stderr is not one; a ``NoBar`` when not ``show``."""
    if not show:
        return NoBar()
    if not sys.stderr.isatty():
        return LineBar(total, unit=unit, initial=initial, every=every or max(1, (total or 10) // 10))
    from tqdm.auto import tqdm

    unit_scale = unit == "B"
    return tqdm(total=total, initial=initial, unit=unit, unit_scale=unit_scale, dynamic_ncols=True, leave=leave)
