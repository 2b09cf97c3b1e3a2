"""A table with one long-text column that stays readable in a narrow terminal.

A Rich table squeezes every column to fit the console, and at 80 columns an
error message or a fix ends up folded into a strip a dozen characters wide, one
word per line. :class:`FitTable` decides when it is drawn, from the width it
is given: the table when its long column gets enough room, else one entry per
row, the short fields on a line of their own and the long text below them at
full width.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

__all__ = ["FitTable"]

# Below this many characters for the long column, the table turns into entries.
MIN_LONG_WIDTH = 40
_CELL_PADDING = 3  # a table cell's border and its two padding spaces


@dataclass(slots=True)
class FitTable:
    """Columns of short fields and a last column of long text.

    ``columns`` names the short fields (the first is the row's name and is shown
    without its header in the stacked form); ``long_header`` names the long one.
    """

    title: str
    columns: Sequence[str]
    long_header: str
    rows: list[tuple[list[Text], Text]] = field(default_factory=list)
    no_wrap: frozenset[str] = frozenset()  # short columns never folded in the table

    def add_row(self, *cells: str | Text, long: str | Text) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(([_text(c) for c in cells], _text(long)))

    def __rich_console__(
        self, console: Console, options: ConsoleOptions
    ) -> Iterator[RenderableType]:
        if self._long_room(options.max_width) >= self._long_needed():
            yield self.table()
            return
        yield Text(self.title, style="italic", justify="center")
        for cells, long in self.rows:
            yield self._entry_head(cells)
            if long.plain:
                yield Padding(long, (0, 0, 0, 2))

    def table(self) -> Table:
        """The wide form."""
        table = Table(title=self.title, expand=False)
        for name in self.columns:
            table.add_column(name, no_wrap=name in self.no_wrap)
        table.add_column(self.long_header, overflow="fold")
        for cells, long in self.rows:
            table.add_row(*cells, long)
        return table

    def _long_room(self, width: int) -> int:
        """Characters left for the long column when the short ones are at their
        natural width."""
        short = 0
        for index, name in enumerate(self.columns):
            widest = max([len(name), *(_widest_line(row[0][index]) for row in self.rows)])
            short += widest + _CELL_PADDING
        return width - short - _CELL_PADDING - 1

    def _long_needed(self) -> int:
        longest = max((_widest_line(long) for _, long in self.rows), default=0)
        return min(MIN_LONG_WIDTH, longest)

    def _entry_head(self, cells: list[Text]) -> Text:
        """``name: header value, header value, ...`` of one row's short fields."""
        head = Text()
        if cells[0].plain:
            head.append_text(cells[0].copy())
            head.append(": ")
        parts = [
            (name, cell)
            for name, cell in zip(self.columns[1:], cells[1:], strict=True)
            if cell.plain
        ]
        for index, (name, cell) in enumerate(parts):
            if index:
                head.append(", ")
            if name and not cell.plain.startswith(name):  # not "exit exit 1"
                head.append(f"{name} ", style="dim")
            head.append_text(cell.copy())
        return head


def _text(value: str | Text) -> Text:
    return value if isinstance(value, Text) else Text(value)


def _widest_line(text: Text) -> int:
    return max((len(line) for line in text.plain.splitlines()), default=0)
