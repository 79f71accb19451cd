"""What an experiment returns: its table, settings, raw series and notes (``seqzoo.lab.experiments``
writes them out as markdown, JSON and a picture)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExperimentResult:
    """A finished experiment: a table (``columns`` × ``rows``), its settings, the raw series
    behind the picture (``data``), what the run showed in words (``notes``), and its run time."""

    name: str
    title: str
    columns: list[str]
    rows: list[list]
    settings: dict
    data: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def markdown(self) -> str:
        """The table as GitHub markdown (numbers with three decimals, one from 100 up)."""
        def cell(value) -> str:
            if isinstance(value, float):
                if abs(value) >= 100:
                    return f"{value:.1f}"
                return f"{value:.3g}" if abs(value) < 1e-2 and value != 0 else f"{value:.3f}"
            return str(value)

        lines = [f"| {' | '.join(self.columns)} |", "|" + "---|" * len(self.columns)]
        lines += [f"| {' | '.join(cell(v) for v in row)} |" for row in self.rows]
        return "\n".join(lines)
