"""LeRobot as lerobot 0.6 and its editing tools write it, generated with the project's own writer:
pandas-rewritten data files beside later ones, annotation columns inferred per file, depth in
both of 0.6's forms, 0.6's metadata keys; and the one-line refusals of real conflicts."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import arrow_types, storage, video
from formats.errors import FormatError
from formats.sources import lerobot_v3
from formats.sources.lerobot_v3.sample import SAY_TOOL, SyntheticLeRobot, write_dataset

EDITED = SyntheticLeRobot(
    lengths=(7, 9, 6, 8), fps=15, lerobot_version="0.6.1", cameras=(), episodes_per_data_file=2,
    list_data_files=(0,),  # modify_tasks rewrote file 0 through pandas; file 1 was recorded after resume
    annotated_episodes=(2, 3),  # lerobot-annotate: file 0 holds only empty lists (list<null>)
    depth_image_cameras=("observation.images.front_depth",),
)


def _plan(path):
    fs, root = storage.open_root(str(path))
    meta, refs = lerobot_v3.plan(fs, root)
    return fs, root, meta, refs


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot061") / "ds"
    return root, write_dataset(str(root), EDITED)


def test_writer_reproduces_the_edited_layouts(edited):
    root, _ = edited
    first, second = (pq.read_schema(root / f"data/chunk-000/file-00{i}.parquet") for i in (0, 1))
    assert first.field("action").type == pa.list_(pa.float32())
    assert second.field("action").type == pa.list_(pa.float32(), 6)
    assert first.field("language_events").type == pa.list_(pa.null())
    assert pa.types.is_struct(second.field("language_events").type.value_type)
    assert pq.read_table(root / "meta/tasks.parquet").column_names == ["task_index", "task"]


def test_one_schema_rule_reads_every_file_exactly(edited):
    root, truth = edited
    fs, root, meta, refs = _plan(root)
    types = {spec.name: spec for spec in meta.columns}
    assert types["action"].arrow_type == pa.list_(pa.list_(pa.float32(), 6))
    events_type = types["language_events"].arrow_type.value_type
    assert pa.types.is_struct(events_type.value_type)  # the annotated file's type, not list<null>
    assert types["language_events"].meta["type"] == "language"
    assert meta.source["tools"] == [SAY_TOOL]
    for ref in refs:
        sequence = lerobot_v3.load(fs, root, ref, meta)
        i = ref.episode_index
        assert sequence.trajectories["action"].dtype == np.float32
        assert sequence.trajectories["action"].tobytes() == truth["action"][i].tobytes()
        assert sequence.trajectories["obs_state"].tobytes() == truth["state"][i].tobytes()
        for name in ("language_persistent", "language_events"):
            column = sequence.steps[name]
            assert column.type == types[name].arrow_type.value_type
            assert column.to_pylist() == truth[name][i]
    annotated = lerobot_v3.load(fs, root, refs[2], meta).steps["language_events"].to_pylist()
    assert annotated[1][0]["tool_calls"][0]["function"]["arguments"] == {"text": "hello 2"}


def test_depth_images_and_061_keys(edited):
    root, truth = edited
    _, _, meta, _ = _plan(root)
    depth = meta.column("video_front_depth")
    assert depth.meta["is_depth_map"] is True and depth.meta["depth_unit"] == "mm"
    assert depth.meta["pix_fmt"] == "gray16le"  # the TIFF's samples, so the encode is lossless FFV1
    blob = truth["images"]["observation.images.front_depth"][1][3]
    assert blob[:4] == b"II*\x00"
    np.testing.assert_array_equal(video.ImageDecoder().decode(blob, 0).to_ndarray(), truth["frames"]["observation.images.front_depth"][1][3])


def _rewrite(path, name, array):
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, array), path)


def test_list_steps_must_hold_the_declared_dimension(tmp_path):
    root = tmp_path / "ds"
    write_dataset(str(root), SyntheticLeRobot(lengths=(3, 4), cameras=(), episodes_per_data_file=1, list_data_files=(1,)))
    second = root / "data/chunk-000/file-001.parquet"
    values = pq.read_table(second).column("action").to_pylist()
    values[2] = values[2][:5]
    _rewrite(second, "action", pa.array(values, pa.list_(pa.float32())))
    fs, root_, meta, refs = _plan(root)
    with pytest.raises(FormatError, match=r"file-001.parquet: episode_000001: feature 'action': step 2 holds 5 values, info.json declares 6$"):
        lerobot_v3.load(fs, root_, refs[1], meta)


@pytest.mark.parametrize("kind, shown", [
    (pa.list_(pa.float64()), "list<element: double>"),
    (pa.list_(pa.float32(), 5), "fixed_size_list<element: float>[5]"),
])
def test_real_conflicts_name_both_files(tmp_path, kind, shown):
    root = tmp_path / "ds"
    write_dataset(str(root), SyntheticLeRobot(lengths=(3, 5), cameras=(), episodes_per_data_file=1))
    second = root / "data/chunk-000/file-001.parquet"
    flat = pq.read_table(second).column("action").combine_chunks().flatten()
    if pa.types.is_fixed_size_list(kind):
        array = pa.FixedSizeListArray.from_arrays(flat.slice(0, 25), 5)
    else:
        array = pa.ListArray.from_arrays(pa.array(np.arange(0, 31, 6), pa.int32()), flat.cast(pa.float64()))
    _rewrite(second, "action", array)
    with pytest.raises(FormatError) as error:
        _plan(root)
    assert str(error.value) == (f"{second}: episode_000001: schema drift between data files: action is {shown} here, "
                                f"fixed_size_list<element: float>[6] in {root / 'data/chunk-000/file-000.parquet'}")


def test_merge_and_conform_types():
    persistent = pa.struct([("role", pa.string()), ("camera", pa.null()), ("tool_calls", pa.null())])
    other = pa.struct([("role", pa.string()), ("camera", pa.string()), ("tool_calls", pa.list_(pa.struct([("name", pa.string())])))])
    merged = arrow_types.merge_types(pa.list_(pa.null()), pa.list_(persistent))
    merged = arrow_types.merge_types(merged, pa.list_(other))
    assert merged == pa.list_(other)
    with pytest.raises(TypeError):
        arrow_types.merge_types(pa.list_(pa.float32(), 6), pa.list_(pa.float32(), 7))
    with pytest.raises(TypeError):
        arrow_types.merge_types(pa.float32(), pa.int64())
    rows = [[{"role": "user", "camera": None, "tool_calls": None}], [], None]
    conformed = arrow_types.conform(pa.array(rows, pa.list_(persistent)).slice(0, 3), merged)
    assert conformed.type == merged and conformed.to_pylist() == rows
    empty = arrow_types.conform(pa.array([[], []], pa.list_(pa.null())), merged)
    assert empty.type == merged and empty.to_pylist() == [[], []]


def test_gaps_in_file_numbers_after_delete_episodes(tmp_path):
    """delete_episodes / split_dataset leave gaps in file numbers: paths come from the episodes table."""
    root = tmp_path / "ds"
    truth = write_dataset(str(root), SyntheticLeRobot(lengths=(3, 4, 5), cameras=(), episodes_per_data_file=1, lerobot_version="0.6.1"))
    (root / "data/chunk-000/file-002.parquet").rename(root / "data/chunk-000/file-007.parquet")
    (root / "data/chunk-000/file-001.parquet").unlink()  # episode 1 deleted
    episodes_file = root / "meta/episodes/chunk-000/file-000.parquet"
    rows = [row for row in pq.read_table(episodes_file).to_pylist() if row["episode_index"] != 1]
    rows[1]["data/file_index"] = 7
    pq.write_table(pa.Table.from_pylist(rows), episodes_file)
    info = json.loads((root / "meta/info.json").read_text())  # delete_episodes rewrites the totals too
    (root / "meta/info.json").write_text(json.dumps({**info, "total_episodes": 2}))
    fs, root_, meta, refs = _plan(root)
    assert [ref.data_file for ref in refs] == ["data/chunk-000/file-000.parquet", "data/chunk-000/file-007.parquet"]
    for ref in refs:
        sequence = lerobot_v3.load(fs, root_, ref, meta)
        assert sequence.trajectories["action"].tobytes() == truth["action"][ref.episode_index].tobytes()
