"""The presentation model: a section is a title and blocks (paragraphs, tables, images, subsections)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from harness.formatting import cell

STATISTICS_DOC = "docs/statistics.md"  # the methods, explained once (the report links it)
METHODS_DOC = "docs/methods.md"  # the verdict rule, stated once


@dataclass(frozen=True)
class Table:
    """A table: column names, rows of values, one alignment letter per column ('l', 'r', 'c')."""

    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    align: str = ""

    @classmethod
    def of(cls, cells: Mapping[str, Callable[[Any], Any]], records: Iterable[Any], align: str = "") -> Table:
        """A table whose columns are ``cells``' names; each row applies every cell to one record."""
        return cls(list(cells), [[cell(r) for cell in cells.values()] for r in records], align)


@dataclass(frozen=True)
class Image:
    """A figure drawn into a run's figures folder, with its caption."""

    path: Path
    caption: str


Block = Union[str, Table, Image, "Section"]  # a str is a paragraph (lines of a list included)


@dataclass
class Section:
    """A titled part of a report; ``depth`` 2 for a summary or a run, 3 for a run's parts, 4 below."""

    title: str
    blocks: list[Block] = field(default_factory=list)
    depth: int = 3

    def add(self, *blocks: Block | None) -> Section:
        self.blocks.extend(b for b in blocks if b is not None and b != "")
        return self

    @classmethod
    def of_lines(cls, title: str, lines: Sequence[Block], depth: int = 3) -> Section:
        """A section of paragraphs from lines separated by empty lines (any other block stands alone)."""
        section, para = cls(title, depth=depth), []
        for line in [*lines, ""]:
            if isinstance(line, str) and line:
                para.append(line)
                continue
            section.add("\n".join(para))
            para = []
            if not isinstance(line, str):
                section.add(line)
        return section


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table; ``align`` holds one of 'l', 'r', 'c' per column (left by default)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    rule = [marks.get(align[i] if i < len(align) else "l", "---") for i in range(len(columns))]
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "| " + " | ".join(rule) + " |"]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def markdown_image(path: Path, caption: str) -> str:
    """An image in a figures folder beside the markdown, referenced relative to the markdown's folder."""
    target = f"{Path(path).parent.name}/{Path(path).name}"
    return f"![{caption}](<{target}>)" if any(ch in target for ch in " ()<>") else f"![{caption}]({target})"


def _block_markdown(block: Block) -> str:
    if isinstance(block, Table):
        return markdown_table(block.columns, block.rows, block.align)
    if isinstance(block, Image):
        return markdown_image(block.path, block.caption)
    if isinstance(block, Section):
        return "\n".join(markdown(block))
    return block


def markdown(section: Section | None) -> list[str]:
    """A section as markdown lines (none for an empty one)."""
    if section is None:
        return []
    lines = [f"{'#' * section.depth} {section.title}"] if section.title else []
    for block in section.blocks:
        lines += ([""] if lines else []) + [_block_markdown(block)]
    return lines
