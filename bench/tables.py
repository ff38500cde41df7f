"""Tables the benchmarks print: aligned text for a terminal, or Markdown for docs/. Pure."""

from __future__ import annotations

from collections.abc import Sequence


def render(header: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool) -> str:
    """``header`` and ``rows`` (all strings) as right-aligned columns, or as a Markdown table."""
    everything = [list(header), *[list(r) for r in rows]]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in everything]
        lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in everything) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                     for r in everything)
