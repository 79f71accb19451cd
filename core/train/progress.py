"""The progress bar of training and evaluation: tqdm's when it is installed and wanted, else one
that does nothing (tqdm is optional)."""
from __future__ import annotations


class NoBar:
    """A progress bar that shows nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: object) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, *, unit: str, initial: int = 0, show: bool = True, leave: bool = True):
    """A tqdm bar over ``total`` ``unit`` s (or a ``NoBar`` when not ``show`` or without tqdm)."""
    if show:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return NoBar()
        return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, leave=leave)
    return NoBar()
