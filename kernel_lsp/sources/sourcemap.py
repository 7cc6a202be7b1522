"""Position maps from a generated file (load_inline's cuda.cu / main.cpp) back to the document it came from.

All positions are 0-based (line, column), columns counted in Python characters, as in `findings.Range`.
A map is stored as runs: stretches of a generated line whose characters sit side by side in the original.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import NamedTuple, overload

from kernel_lsp.findings import Position, Range


class CharPositions(Sequence[tuple[int, int]]):
    """The original (line, col) of each character of a decoded text, kept as runs of adjacent columns."""

    __slots__ = ("_starts", "_origins", "_length")

    def __init__(self) -> None:
        self._starts: list[int] = []  # index of the first character of each run
        self._origins: list[tuple[int, int]] = []  # original (line, col) of that character
        self._length = 0

    @classmethod
    def of(cls, positions: Iterable[tuple[int, int]]) -> "CharPositions":
        result = cls()
        for line, col in positions:
            result.append(line, col)
        return result

    def append(self, line: int, col: int) -> None:
        if self._origins:
            last_line, last_col = self._origins[-1]
            if last_line == line and last_col + (self._length - self._starts[-1]) == col:
                self._length += 1
                return
        self._starts.append(self._length)
        self._origins.append((line, col))
        self._length += 1

    def concatenated(self, other: "CharPositions") -> "CharPositions":
        result = CharPositions()
        for positions in (self, other):
            for _, length, line, col in positions.runs():
                result.append_run(line, col, length)
        return result

    def append_run(self, line: int, col: int, length: int) -> None:
        """`length` characters from (line, col) on, side by side in the original."""
        if length == 0:
            return
        self.append(line, col)  # merges with the previous run when adjacent
        self._length += length - 1

    def runs(self) -> Iterator[tuple[int, int, int, int]]:
        """(first index, length, original line, original col) of each run."""
        for k, (start, origin) in enumerate(zip(self._starts, self._origins)):
            end = self._starts[k + 1] if k + 1 < len(self._starts) else self._length
            yield start, end - start, origin[0], origin[1]

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, int]]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        k = bisect_right(self._starts, index) - 1
        line, col = self._origins[k]
        return line, col + (index - self._starts[k])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CharPositions):
            return NotImplemented
        return (self._starts, self._origins, self._length) == (other._starts, other._origins, other._length)

    def __repr__(self) -> str:
        return f"CharPositions(runs={list(self.runs())!r})"


class Segment(NamedTuple):
    """Generated line `line`, columns [start, end), come from original `origin_line` from `origin_col` on."""

    line: int
    start: int
    end: int
    origin_line: int
    origin_col: int


class SourceMap:
    """Generated (line, col) -> original (line, col)."""

    def __init__(self, segments: Iterable[Segment]) -> None:
        self._by_line: dict[int, list[Segment]] = {}
        for segment in segments:
            if segment.end > segment.start:
                self._by_line.setdefault(segment.line, []).append(segment)
        for runs in self._by_line.values():
            runs.sort()

    def to_original(self, line: int, col: int) -> tuple[int, int] | None:
        """The original position; the column just past a run maps just past its original text."""
        run = self._run_at(line, col)
        if run is None:
            return None
        return run.origin_line, run.origin_col + (col - run.start)

    def range_to_original(self, rng: Range) -> Range | None:
        """None when the start has no origin; an end without one is cut back to the end of the start's run."""
        start_run = self._run_at(rng.start.line, rng.start.character)
        if start_run is None:
            return None
        start = Position(start_run.origin_line, start_run.origin_col + (rng.start.character - start_run.start))
        end = self._end_to_original(rng)
        if end is None or end < start:
            end = Position(start_run.origin_line, start_run.origin_col + (start_run.end - start_run.start))
        return Range(start, end)

    def _end_to_original(self, rng: Range) -> Position | None:
        end = rng.end
        if end.character > 0 and end != rng.start:
            last = self.to_original(end.line, end.character - 1)  # the last character inside the range
            return None if last is None else Position(last[0], last[1] + 1)
        return self._position(end.line, end.character)

    def _position(self, line: int, col: int) -> Position | None:
        mapped = self.to_original(line, col)
        return None if mapped is None else Position(*mapped)

    def _run_at(self, line: int, col: int) -> Segment | None:
        runs = self._by_line.get(line)
        if not runs or col < 0:
            return None
        k = bisect_right(runs, col, key=itemgetter(1)) - 1
        if k < 0 or col > runs[k].end:
            return None
        return runs[k]


class GeneratedFile:
    """Builds a generated text piece by piece while recording where each piece came from."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._segments: list[Segment] = []
        self._line = 0
        self._col = 0
        self._map: SourceMap | None = None  # built on first use, dropped when more text comes

    def add_text(self, text: str, origin: tuple[int, int] | None = None) -> None:
        """Text with no origin (what torch adds), or copied verbatim from the original starting at `origin`."""
        runs: list[tuple[int, int, int, int]] = []
        if origin is not None:
            offset = 0
            for k, piece in enumerate(text.split("\n")):
                length = len(piece) + (offset + len(piece) < len(text))  # the newline belongs to its line
                runs.append((offset, length, origin[0] + k, origin[1] if k == 0 else 0))
                offset += length
        self._append(text, runs)

    def add_literal(self, decoded_text: str, char_positions: Sequence[tuple[int, int]]) -> None:
        """A decoded string whose character i came from original position char_positions[i]."""
        if len(char_positions) != len(decoded_text):
            raise ValueError(f"{len(char_positions)} positions for {len(decoded_text)} characters")
        if not isinstance(char_positions, CharPositions):
            char_positions = CharPositions.of(char_positions)
        self._append(decoded_text, char_positions.runs())

    def _append(self, text: str, runs: Iterable[tuple[int, int, int, int]]) -> None:
        newlines = [i for i, ch in enumerate(text) if ch == "\n"] if "\n" in text else []
        for start, length, origin_line, origin_col in runs:
            self._add_run(text, newlines, start, start + length, origin_line, origin_col)
        self._parts.append(text)
        self._map = None
        if newlines:
            self._line += len(newlines)
            self._col = len(text) - newlines[-1] - 1
        else:
            self._col += len(text)

    def _add_run(self, text: str, newlines: list[int], start: int, end: int, origin_line: int, origin_col: int) -> None:
        """Records text[start:end], split where it crosses a generated line break."""
        offset = start
        while offset < end:
            newline = text.find("\n", offset, end)
            piece_end = end if newline < 0 else newline + 1
            line, col = self._generated_position(newlines, offset)
            length = piece_end - offset
            self._segments.append(Segment(line, col, col + length, origin_line, origin_col + offset - start))
            offset = piece_end

    def _generated_position(self, newlines: list[int], offset: int) -> tuple[int, int]:
        before = bisect_right(newlines, offset - 1)  # newlines strictly before offset
        if before == 0:
            return self._line, self._col + offset
        return self._line + before, offset - newlines[before - 1] - 1

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def map(self) -> SourceMap:
        if self._map is None:
            self._map = SourceMap(self._segments)
        return self._map
