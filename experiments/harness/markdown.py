"""The markdown tables ``report`` prints, read back: the claims table's header (the claims
board finds a printed report's claims by it), one table line's cells, and every cell of a
printout (``report --compare``).
"""

from __future__ import annotations

#: how a claims table's header begins (a report printed before its scale column ends there)
CLAIMS_HEADER_START = "| claim | metric | paper diff | ours: baseline -> proposal |"
CLAIMS_HEADER = ("| claim | metric | paper diff | ours: baseline -> proposal | ours diff [95% CI] "
                 "| p | verdict | seeds x units | scale |")


#: the columns a rerun on another machine or load changes without a change of the numbers
LOAD_COLUMNS = ("steps/s", "peak MB", "wall min")


def table_row(line: str) -> list[str]:
    """The cells of one markdown table line (``| a | b |`` -> ``["a", "b"]``), stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_cells(text: str) -> dict[tuple[str, str, str], str]:
    """(table heading, row's first cell, column) -> cell text of every markdown table in a
    printout, the load-dependent :data:`LOAD_COLUMNS` left out; the heading is the last
    ``#`` line above the table (a printout's tables are told apart by it and their header)."""
    cells, heading, header = {}, "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if not line.startswith("|"):
            header = None
            continue
        row = table_row(line)
        if header is None:
            header = row
        elif not set("".join(row)) <= set("-: "):
            for column, value in zip(header[1:], row[1:], strict=False):
                if column not in LOAD_COLUMNS:
                    cells[(f"{heading} [{header[0]}]", row[0], column)] = value
    return cells
