"""The console every command prints through, so output fits where it goes.

Into a file or a pipe each print is laid out at its own full width (nothing wrapped, cropped or elided: a script
or a log reads every digit, every column, every title); on a terminal too narrow for a table, the table is printed
row by row, one `column: value` line per cell, rather than losing columns or cutting cells, and a panel title too
long for the terminal goes on its own line above the panel. Light to import (rich only): the error path and
`servelab --help` use it too.
"""

from __future__ import annotations

import copy
from typing import Any

from rich.console import Console, ConsoleDimensions, Group, RenderableType
from rich.measure import Measurement
from rich.panel import Panel
from rich.protocol import is_renderable
from rich.table import Table
from rich.text import Text

UNBOUNDED = 100_000
"""The width a file or a pipe has: more than any line servelab prints."""
MIN_WIDTH = 80
"""The width a print into a file or a pipe takes at least (a panel spans it, as on an 80-column terminal)."""


class FittingConsole(Console):
    """A rich Console that never crops, elides or drops what it prints (see the module docstring)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(UNBOUNDED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if self.is_terminal:
            objects = tuple(fit(self, o) for o in objects)
        elif kwargs.get("width") is None:
            kwargs["width"] = max([MIN_WIDTH, *(natural_width(self, o) for o in objects if is_renderable(o))])
        super().print(*objects, **kwargs)


def make_console(stderr: bool = False) -> Console:
    """The console every command prints through: stdout, or stderr for messages and progress beside --json."""
    return FittingConsole(stderr=stderr)


def natural_width(out: Console, renderable: RenderableType) -> int:
    """The width `renderable` takes when nothing constrains it: its longest line, its table at full width."""
    return Measurement.get(out, out.options.update(width=UNBOUNDED), renderable).maximum


def fit(out: Console, renderable: Any) -> Any:
    """What the terminal prints for `renderable`: itself where it fits; a too-wide table row by row; a panel whose
    title would be cut, with the title on its own line above it."""
    if isinstance(renderable, Table) and natural_width(out, renderable) > out.width:
        return by_row(renderable)
    if isinstance(renderable, Panel) and renderable.title is not None:
        title = Text.from_markup(renderable.title) if isinstance(renderable.title, str) else renderable.title
        if title.cell_len > out.width - 6:  # the corners, the rule each side and a space each side
            untitled = copy.copy(renderable)
            untitled.title = None
            return Group(Text.assemble(title, style="bold"), untitled)
    return renderable


def by_row(table: Table) -> RenderableType:
    """A table too wide for the terminal, as one block per row: each cell on its own line after its column's
    header, wrapped at word boundaries; a table without headers keeps its columns, wrapping its cells instead."""
    if not table.show_header:
        for column in table.columns:
            column.overflow, column.no_wrap = "fold", False
        return table
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", overflow="fold")
    grid.add_column(overflow="fold")
    cells = [list(column.cells) for column in table.columns]
    for row in range(table.row_count):
        if row:
            grid.add_row("", "")
        for column, column_cells in zip(table.columns, cells):
            grid.add_row(
                Text.assemble(column.header, ":") if isinstance(column.header, (str, Text)) else column.header,
                column_cells[row],
            )
    title = (
        [Text.from_markup(table.title, style="italic") if isinstance(table.title, str) else table.title]
        if table.title
        else []
    )
    return Group(*title, grid)
