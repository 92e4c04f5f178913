"""formats.mixtrain.array_layout: raw little-endian trajectory cells, encoded and read back without a copy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from formats import mixtrain
from formats.mixtrain import array_layout
from formats.sequence import ColumnSpec, Sequence
from pipelines import cli


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8"])
def test_cells_round_trip_bit_for_bit_with_nan_empty_and_big_endian_input(dtype):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(5, 3)).astype(dtype), np.zeros((0, 3), dtype), rng.normal(size=(2, 3)).astype(dtype)]
    if arrays[0].dtype.kind == "f":
        arrays[0][1, 2], arrays[2][0, 0] = np.nan, -np.inf
    arrays[2] = arrays[2].astype(np.dtype(dtype).newbyteorder(">"))  # a big-endian source array is stored little-endian
    cells = array_layout.encode(arrays, dtype)
    assert cells.type == pa.binary() and len(cells) == 3
    assert cells[0].as_py() == np.ascontiguousarray(arrays[0], np.dtype(dtype).newbyteorder("<")).tobytes()
    sliced = cells.slice(1)  # an offset into the array, as a one-row read gives
    for index, (array, expected) in enumerate([(cells, arrays[0]), (sliced, arrays[1]), (sliced, arrays[2])]):
        row = 0 if index < 2 else 1
        got = array_layout.decode(array, row, dtype, 3)
        assert got.dtype == np.dtype(dtype) and got.shape == expected.shape
        assert got.tobytes() == expected.astype(np.dtype(dtype)).tobytes()


def test_decode_is_a_view_and_refuses_a_partial_step():
    cells = array_layout.encode([np.arange(6, dtype=np.float32).reshape(3, 2)], "float32")
    view = array_layout.decode(cells, 0, "float32", 2)
    assert np.shares_memory(view, np.frombuffer(cells.buffers()[2], np.uint8))
    broken = pa.array([b"\x00" * 7], pa.binary())
    with pytest.raises(ValueError, match="not a whole number of 2 x"):
        array_layout.decode(broken, 0, "float32", 2)
    assert array_layout.decode(pa.array([None], pa.binary()), 0, "float32", 2) is None


def test_with_layout_changes_only_trajectories_and_records_dtype_shape_and_layout():
    columns = [ColumnSpec("sequence_id", "scalar", pa.string()), ColumnSpec.trajectory("action", np.float32, 7),
               ColumnSpec.steps("flag", pa.bool_())]
    assert array_layout.with_layout(columns, "lists") == columns
    raw = array_layout.with_layout(columns, "bytes")
    assert raw[0] == columns[0] and raw[2] == columns[2]
    assert raw[1].arrow_type == pa.binary() and array_layout.cell_type(mixtrain.column_types(raw)["action"]) == pa.binary()
    assert mixtrain.column_types(raw)["action"] == {"type": "trajectory", "dim": 7, "dtype": "float32", "layout": "bytes",
                                                    "byte_order": "little", "cell_shape": [-1, 7]}
    assert array_layout.cell_type(mixtrain.column_types(columns)["action"]) == pa.list_(pa.list_(pa.float32(), 7))
    with pytest.raises(ValueError, match="unknown array layout 'rows'"):
        array_layout.with_layout(columns, "rows")


def test_rows_round_trip_through_the_writer_tables_in_both_layouts():
    rng = np.random.default_rng(1)
    sequences = []
    for index, length in enumerate((4, 1, 6)):
        sequence = Sequence(f"s{index}", length, np.arange(length, dtype=np.float64))
        sequence.trajectories["action"] = rng.normal(size=(length, 7)).astype(np.float32)
        sequences.append(sequence)
    base = [ColumnSpec("sequence_id", "scalar", pa.string()), ColumnSpec("length", "scalar", pa.int64()),
            ColumnSpec.trajectory("action", np.float32, 7)]
    for layout in array_layout.LAYOUTS:
        columns = array_layout.with_layout(base, layout)
        for sequence in sequences:
            sequence.scalars["length"] = sequence.length
        back = mixtrain.table_to_sequences(mixtrain.sequences_to_table(sequences, columns), columns)
        for before, after in zip(sequences, back):
            assert after.trajectories["action"].tobytes() == before.trajectories["action"].tobytes()
            assert after.trajectories["action"].shape == before.trajectories["action"].shape


def test_the_command_line_knows_the_layouts_and_refuses_lance_options_without_lance():
    assert cli.ARRAY_LAYOUTS == array_layout.LAYOUTS
    from formats.mixtrain.tables import lance
    assert cli.LANCE_VIDEOS == lance.VIDEO_STORAGE
    assert cli.parse(["--input=a", "--output=b"])[0].array_layout == "lists"
    with pytest.raises(cli.UsageError, match="^--lance_videos has no effect without --table_format=lance$"):
        cli.parse(["--input=a", "--output=b", "--lance_videos=reference"])
    with pytest.raises(cli.UsageError, match="invalid choice: 'rows'"):
        cli.parse(["--input=a", "--output=b", "--array_layout=rows"])


def test_bytes_cells_carry_no_parquet_statistics_or_dictionary(tmp_path):
    """docs/lance.md: statistics and dictionary encoding are off for `bytes` cells (min/max of raw
    bytes mean nothing; two whole cells per page). The other leaves of the same shard keep theirs."""
    import pyarrow.parquet as pq

    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
    from pipelines import convert

    write_dataset(str(tmp_path / "src"), SyntheticLeRobot(lengths=(5, 4, 6), cameras=()))
    dst = tmp_path / "dst"
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={dst}", "--progress=off", "--array_layout=bytes"]) == 0
    metadata = pq.ParquetFile(dst / "data/part-00000.parquet").metadata
    group = metadata.row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    cells = [path for path, chunk in chunks.items() if chunk.physical_type == "BYTE_ARRAY" and path in ("action", "obs_state")]
    assert sorted(cells) == ["action", "obs_state"]
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    for path in cells:
        assert not chunks[path].is_stats_set and chunks[path].statistics is None, path
        assert not chunks[path].has_dictionary_page and not dictionary & set(chunks[path].encodings), path
    control = chunks["sequence_id"]  # a string leaf of the same shard: statistics and a dictionary
    assert control.is_stats_set and control.statistics.min == "episode_000000" and control.has_dictionary_page
