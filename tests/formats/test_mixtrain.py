import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import mixtrain
from formats.mixtrain import array_layout
from formats.sequence import SCALAR, VIDEO, ColumnSpec, Sequence, base_columns


def _columns():
    return base_columns() + [
        ColumnSpec.trajectory("action", np.float64, 3, source="action"),
        ColumnSpec.steps("reward", pa.float32(), source="reward"),
        ColumnSpec.steps("note", pa.string(), source="note"),
        ColumnSpec("video_cam", VIDEO, pa.string(), {"fps": 10, "source": "cam"}),
        ColumnSpec("task", SCALAR, pa.string()),
    ]


def _sequence(i, length):
    rng = np.random.default_rng(i)
    return Sequence(
        sequence_id=f"s{i}",
        length=length,
        timestamp=np.arange(length) / 10.0,
        scalars={"length": length, "duration_seconds": length / 10.0, "task": f"t{i}"},
        trajectories={"action": rng.normal(size=(length, 3))},
        steps={"reward": rng.random(length).astype(np.float32), "note": pa.array([f"n{k}" for k in range(length)])},
        videos={"video_cam": f"files/video_cam/s{i}.mp4"},
    )


def test_rows_roundtrip_through_parquet_bit_exact():
    sequences = [_sequence(i, n) for i, n in enumerate((5, 1, 8))]
    table = mixtrain.sequences_to_table(sequences, _columns())
    buffer = io.BytesIO()
    mixtrain.write_shard(table, buffer)
    back = pq.read_table(io.BytesIO(buffer.getvalue()))
    assert back.schema.field("action").type == pa.list_(pa.list_(pa.float64(), 3))
    assert back.schema.names[0] == "sequence_id"
    for row, sequence in enumerate(sequences):
        got = np.array(back.column("action")[row].as_py())
        assert got.tobytes() == sequence.trajectories["action"].tobytes()
        assert back.column("reward")[row].values.to_numpy().tobytes() == sequence.steps["reward"].tobytes()
        assert back.column("note")[row].as_py() == sequence.steps["note"].to_pylist()
        assert back.column("timestamp")[row].as_py() == sequence.timestamp.tolist()
    assert back.column("length").to_pylist() == [5, 1, 8]


@pytest.mark.parametrize("layout", ["lists", "bytes"])
def test_a_combined_row_group_written_row_by_row_has_the_bytes_of_1_row_chunks(layout):
    """The shard writer (transforms/write.py) writes each row group combined, with
    `shard_writer(row_by_row=True)`, for the bytes earlier versions wrote from tables of 1-row
    chunks: Parquet pages cut after the same rows. That rests on how Arrow batches a column's
    levels (whole rows, even past 1,024 levels), so it is pinned here: a pyarrow that cuts pages
    elsewhere fails this, and a combined table written the default way shows the test can fail."""
    lengths = [60] * 2000 + [1, 3000, 7, 1500, 2, 2500] * 4  # short rows (pages fill mid-batch), and rows past 1,024 levels
    columns = array_layout.with_layout(_columns(), layout)
    table = mixtrain.sequences_to_table([_sequence(i, n) for i, n in enumerate(lengths)], columns)

    def written(groups, row_by_row: bool) -> bytes:
        buffer = io.BytesIO()
        with mixtrain.shard_writer(buffer, table.schema, row_by_row=row_by_row) as writer:
            for group in groups:
                writer.write_table(group, row_group_size=group.num_rows)
        return buffer.getvalue()

    groups = [table.slice(start, 1024) for start in range(0, table.num_rows, 1024)]
    chunked = [pa.Table.from_batches(group.to_batches(max_chunksize=1), schema=table.schema) for group in groups]
    assert all(group.column("sequence_id").num_chunks == group.num_rows for group in chunked)
    combined = [group.combine_chunks() for group in groups]
    before = written(chunked, row_by_row=False)
    assert written(combined, row_by_row=True) == before
    assert written(combined, row_by_row=False) != before  # the pages Arrow cuts by default: other bytes
    assert pq.read_table(io.BytesIO(before)).equals(table)


def test_shard_of_is_stable():
    # Pinned: changing the hash moves rows between files for every existing dataset. Literal values
    # (md5 of the UTF-8 id, first 8 bytes big-endian, mod N; computed once with hashlib).
    assert [mixtrain.shard_of(f"episode_{i:06d}", 4) for i in range(6)] == [3, 3, 3, 2, 1, 2]
    assert [mixtrain.shard_of(f"episode_{i:06d}", 7) for i in range(6)] == [3, 0, 0, 3, 1, 2]
    assert mixtrain.shard_of("episode_000000", 7) == int.from_bytes(
        __import__("hashlib").md5(b"episode_000000").digest()[:8], "big") % 7


def test_column_types_cover_non_scalar_columns():
    types = mixtrain.column_types(_columns())
    assert set(types) == {"timestamp", "action", "reward", "note", "video_cam"}
    assert types["action"] == {"type": "trajectory", "dim": 3, "dtype": "float64", "source": "action"}
    assert types["video_cam"]["type"] == "video"


def _random_json(rng, depth: int = 0, kinds: int = 9):
    kind = rng.integers(0, kinds if depth < 4 else min(kinds, 5))
    if kind == 0:
        return "".join(chr(c) for c in rng.choice([0x22, 0x5C, 0x0A, 0x01, 0x41, 0xE9, 0x2028, 0x1F600, 0xD800 - 1], size=rng.integers(0, 6)))
    if kind == 1:
        return [None, True, False][rng.integers(0, 3)]
    if kind == 2:
        return int(rng.integers(-(2 ** 62), 2 ** 62)) * [1, 10 ** 30][rng.integers(0, 2)]
    if kind == 3:
        return [float(rng.normal()) * 10.0 ** int(rng.integers(-30, 30)), float("nan"), float("inf"), -float("inf"), -0.0, 1e16][rng.integers(0, 6)]
    if kind == 4:
        return {} if rng.integers(0, 2) else []
    if kind in (5, 6):
        return {_random_json(rng, 4, kinds=4) if rng.integers(0, 4) == 0 else f"k{i}": _random_json(rng, depth + 1)
                for i in range(rng.integers(1, 5))} if kind == 5 else tuple(_random_json(rng, depth + 1) for _ in range(rng.integers(1, 4)))
    return [_random_json(rng, depth + 1) for _ in range(rng.integers(1, 5))]


def test_dumps_writes_the_json_modules_indented_text_byte_for_byte():
    """mixtrain.dumps writes the indented text itself (the json module's indented encoder is its
    slow Python one): the same text as json.dumps(indent=2, ensure_ascii=False) of the value with
    NaN and infinities as null, on 2,000 random values; keys that are not strings and types JSON
    cannot write go to the json module, with its answer or its error."""
    import json

    import numpy as np

    finite = mixtrain._finite  # NaN and infinities as null: what the json module's fallback is given

    rng = np.random.default_rng(7)
    for _ in range(2000):
        value = {"v": _random_json(rng)}
        try:
            expected = json.dumps(finite(value), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        except (TypeError, ValueError) as error:
            with pytest.raises(type(error)):
                mixtrain.dumps(value)
            continue
        assert mixtrain.dumps(value) == expected
    assert mixtrain.dumps({1: "a", None: [2.5, {}]}) == '{\n  "1": "a",\n  "null": [\n    2.5,\n    {}\n  ]\n}\n'
    with pytest.raises(TypeError, match="int64"):
        mixtrain.dumps({"a": np.int64(3)})

    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    class Odd(float):  # the json module tests NaN with !=
        def __ne__(self, other):
            return True

    class Items(dict):
        def items(self):
            return [("a", 1)]

    for value in ({"a": Level.HIGH, Level.HIGH.name: [np.float64(1.5), np.float64("nan"), np.float64("-inf")]},
                  {"a": Items()}, [Items(b=2)], ("x", (), [{}])):
        assert mixtrain.dumps(value) == json.dumps(finite(value), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    with pytest.raises(ValueError):
        mixtrain.dumps({"a": Odd(1.5)})
