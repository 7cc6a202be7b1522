"""Position maps from generated files back to the document: CharPositions, GeneratedFile, SourceMap."""

from __future__ import annotations

import pytest

from kernel_lsp.findings import Range
from kernel_lsp.sources.sourcemap import CharPositions, GeneratedFile, Segment, SourceMap


def test_char_positions_merge_adjacent_columns_into_runs():
    positions = CharPositions.of([(3, 4), (3, 5), (3, 6), (3, 8), (4, 0), (4, 1)])
    assert list(positions.runs()) == [(0, 3, 3, 4), (3, 1, 3, 8), (4, 2, 4, 0)]
    assert len(positions) == 6
    assert positions[2] == (3, 6)
    assert positions[3] == (3, 8)
    assert positions[-1] == (4, 1)
    assert positions[1:3] == [(3, 5), (3, 6)]
    with pytest.raises(IndexError):
        positions[6]


def test_char_positions_concatenated_joins_runs_that_touch():
    left = CharPositions.of([(0, 0), (0, 1)])
    right = CharPositions.of([(0, 2), (5, 7)])
    joined = left.concatenated(right)
    assert list(joined.runs()) == [(0, 3, 0, 0), (3, 1, 5, 7)]
    assert list(left.runs()) == [(0, 2, 0, 0)]  # the operands are left alone


def test_text_without_origin_maps_to_nothing():
    generated = GeneratedFile()
    generated.add_text("#include <torch/types.h>\n")
    generated.add_literal("ab", [(7, 3), (7, 4)])
    assert generated.text == "#include <torch/types.h>\nab"
    assert generated.map.to_original(0, 3) is None
    assert generated.map.to_original(1, 0) == (7, 3)
    assert generated.map.to_original(1, 1) == (7, 4)
    assert generated.map.to_original(2, 0) is None


def test_literal_spanning_lines_maps_each_generated_line():
    # "x\nyz" where the line break is a real one in the original (line 2 ends at column 9)
    generated = GeneratedFile()
    generated.add_text("head ")
    generated.add_literal("x\nyz", [(2, 8), (2, 9), (3, 0), (3, 1)])
    source_map = generated.map
    assert generated.text == "head x\nyz"
    assert source_map.to_original(0, 5) == (2, 8)
    assert source_map.to_original(0, 6) == (2, 9)  # the line break itself
    assert source_map.to_original(1, 0) == (3, 0)
    assert source_map.to_original(1, 1) == (3, 1)
    assert source_map.to_original(0, 4) is None


def test_escaped_characters_break_runs():
    # decoded "a\tb" from the literal `a\tb` at line 0, columns 10..13: the tab sits at its backslash
    generated = GeneratedFile()
    generated.add_literal("a\tb", [(0, 10), (0, 11), (0, 13)])
    source_map = generated.map
    assert source_map.to_original(0, 0) == (0, 10)
    assert source_map.to_original(0, 1) == (0, 11)
    assert source_map.to_original(0, 2) == (0, 13)
    assert source_map.to_original(0, 3) == (0, 14)  # just past the last run: just past its original text
    assert source_map.to_original(0, 4) is None


def test_add_text_with_origin_copies_positions_line_by_line():
    generated = GeneratedFile()
    generated.add_text("// x\n")
    generated.add_text("ab\ncd", origin=(10, 4))
    source_map = generated.map
    assert source_map.to_original(1, 1) == (10, 5)
    assert source_map.to_original(2, 0) == (11, 0)
    assert source_map.to_original(2, 1) == (11, 1)


def test_range_to_original_maps_start_and_exclusive_end():
    generated = GeneratedFile()
    generated.add_text("#include <cuda.h>\n")
    generated.add_literal("float kernel;", [(4, 20 + k) for k in range(13)])
    source_map = generated.map
    assert source_map.range_to_original(Range.of(1, 6, 1, 12)) == Range.of(4, 26, 4, 32)
    assert source_map.range_to_original(Range.of(1, 6, 1, 6)) == Range.of(4, 26, 4, 26)
    assert source_map.range_to_original(Range.of(0, 0, 1, 3)) is None


def test_range_end_without_origin_is_cut_to_the_start_run():
    generated = GeneratedFile()
    generated.add_literal("abc", [(1, 0), (1, 1), (1, 2)])
    generated.add_text("\n}")
    source_map = generated.map
    assert source_map.range_to_original(Range.of(0, 1, 1, 1)) == Range.of(1, 1, 1, 3)


def test_source_map_from_segments():
    source_map = SourceMap([Segment(line=2, start=4, end=8, origin_line=9, origin_col=1),
                            Segment(line=2, start=0, end=2, origin_line=5, origin_col=0)])
    assert source_map.to_original(2, 1) == (5, 1)
    assert source_map.to_original(2, 3) is None
    assert source_map.to_original(2, 7) == (9, 4)
    assert source_map.to_original(3, 0) is None


def test_add_literal_rejects_mismatched_positions():
    with pytest.raises(ValueError, match="2 positions for 3 characters"):
        GeneratedFile().add_literal("abc", [(0, 0), (0, 1)])


def test_map_follows_text_added_after_it_was_read():
    generated = GeneratedFile()
    generated.add_literal("a", [(0, 0)])
    assert generated.map.to_original(1, 0) is None
    generated.add_text("\n")
    generated.add_literal("b", [(3, 3)])
    assert generated.map.to_original(1, 0) == (3, 3)
