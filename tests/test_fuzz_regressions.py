"""Inputs the fuzz harnesses (fuzz/, docs/fuzzing.md) found, each kept as the smallest case that
ended in a traceback before its fix: the product must now refuse it with one FormatError naming
the file. Each test states the harness and what escaped."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import storage
from formats.errors import FormatError
from formats.read import reader
from formats.sequence import column_name
from formats.sources import lerobot_v3
from formats.sources.l5kit.zarr_v2 import ZarrArray, write_array
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from pipelines import validate

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _zarr(tmp_path, change):
    write_array(*storage.open_root(str(tmp_path)), np.arange(8, dtype="<f4"), 4)
    meta_path = tmp_path / ".zarray"
    text = change(meta_path.read_text())
    meta_path.write_text(text)
    return storage.open_root(str(tmp_path))


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "malformed JSON: nested too deeply"),  # was RecursionError (harness zarr)
    ('{"zarr_format": ' + "9" * 5_000 + "}", "malformed JSON: Exceeds the limit (4300 digits)"),  # was ValueError (digit limit)
])
def test_zarray_json_that_json_loads_refuses_beyond_decode_errors(tmp_path, text, message):
    fs, root = _zarr(tmp_path, lambda _: text)
    with pytest.raises(FormatError, match=re.escape(f"{root}/.zarray: {message}")):
        ZarrArray(fs, root)


def test_a_dtype_string_numpy_parses_as_python_syntax(tmp_path):
    """harness zarr: `"dtype": ",f4"` reached ast.literal_eval inside np.dtype: SyntaxError escaped."""
    fs, root = _zarr(tmp_path, lambda text: re.sub(r'"dtype": "[^"]*"', '"dtype": ",f4"', text))
    with pytest.raises(FormatError, match=re.escape(f"{root}/.zarray: dtype ',f4' is not a numpy type (SyntaxError")):
        ZarrArray(fs, root)


def test_a_tiny_chunk_whose_header_and_zarray_claim_400_mb_is_refused_before_decoding(tmp_path):
    """Seen while checking the zarr harness's memory contract: blosc allocated the 400 MB a 64-byte
    chunk's header claimed (the .zarray agreeing) before finding no data; chunks were allowed up to
    2 GiB. Now over 256 MiB is refused when the array is opened."""
    fs, root = _zarr(tmp_path, lambda text: text.replace('"chunks": [\n        4\n    ]', '"chunks": [\n        100000000\n    ]'))
    with pytest.raises(FormatError, match=re.escape(f"{root}/.zarray: chunks of 100000000 rows x 4 bytes (400000000 bytes) are larger "
                                                    "than 268435456 bytes, more than this reader decodes in one piece")):
        ZarrArray(fs, root)


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz_lerobot") / "ds"
    write_lerobot(str(path), SyntheticLeRobot(lengths=(3, 2), cameras=()))
    return path


@pytest.mark.parametrize("column, value, found", [
    ("dataset_from_index", None, "1 nulls"),  # was TypeError: int() of None (harness lerobot_json)
    ("dataset_to_index", 3.7, "double"),  # a float offset was truncated: another episode's rows
    ("length", "3", "string"),
])
def test_episode_index_columns_of_the_wrong_type_or_null(lerobot, tmp_path, column, value, found):
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    index = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(index)
    values = table.column(column).to_pylist()
    values[0] = value
    if isinstance(value, str):
        values = [str(v) for v in values]
    position = table.column_names.index(column)
    table = table.set_column(position, column, pa.array(values, type=None if value is not None else table.schema.field(column).type))
    pq.write_table(table, index)
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/{index.relative_to(root)}: episode index column {column!r} must hold integers, "
                                                    f"found {found}")):
        lerobot_v3.plan(fs, url, {})


def _with_tasks(lerobot, tmp_path, tasks: pa.Array):
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    index = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(index)
    pq.write_table(table.set_column(table.column_names.index("tasks"), "tasks", tasks), index)
    return root, index


def test_an_episode_index_with_a_column_twice(lerobot, tmp_path):
    """harness lerobot_json: two columns of one name made table.column(name) raise KeyError."""
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    index = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(index)
    pq.write_table(table.append_column("length", table.column("length")), index)
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/{index.relative_to(root)}: episode index has the column 'length' more than once")):
        lerobot_v3.plan(fs, url, {})


def test_an_info_json_dtype_numpy_does_not_know(lerobot, tmp_path):
    """harness lerobot_json: `"dtype": "float76"` reached np.dtype (TypeError)."""
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["action"].update(dtype="float76", shape=[1])  # shape [1]: the feature parser's dtype check skips it
    (root / "meta/info.json").write_text(json.dumps(info))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: feature 'action' has dtype 'float76', not a numeric type")):
        lerobot_v3.plan(fs, url, {})


def test_an_episode_whose_tasks_are_null_is_planned_with_none(lerobot, tmp_path):
    """harness lerobot_json: a null `tasks` cell took the multi-task check's Python path: len(None)."""
    root, _ = _with_tasks(lerobot, tmp_path, pa.array([None, ["task 1"]], pa.list_(pa.string())))
    fs, url = storage.open_root(str(root))
    meta, refs = lerobot_v3.plan(fs, url, {})
    assert [ref.length for ref in refs] == [3, 2] and [ref.tasks for ref in refs] == [(), ("task 1",)]


def test_tasks_that_are_not_lists_are_refused(lerobot, tmp_path):
    root, index = _with_tasks(lerobot, tmp_path, pa.array(["task 0", "task 1"]))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/{index.relative_to(root)}: episode index column 'tasks' must hold lists of "
                                                    "task texts, found string")):
        lerobot_v3.plan(fs, url, {})


def test_an_rlds_record_whose_steps_disagree_is_refused_in_one_message(tmp_path):
    """harness rlds_example: the FormatError of _to_sequence (a ValueError) was caught again and
    wrapped: "features do not match features.json (FormatError: record 0: ...)"."""
    from tensorflow_datasets.proto import tf_example_pb2

    from formats.sources import rlds
    from formats.sources.rlds import tfrecord
    from formats.sources.rlds.records import Reader, RecordRef
    from formats.sources.rlds.sample import SyntheticRLDS
    from formats.sources.rlds.sample import write_dataset as write_rlds

    write_rlds(str(tmp_path / "ds"), SyntheticRLDS(splits={"train": (3,)}, shards={"train": 1}))
    fs, root = storage.open_root(str(tmp_path / "ds"))
    meta, shards = rlds.plan(fs, root, {"fps": 10})
    with fs.open(f"{root}/{shards[0].path}", "rb") as handle:
        (offset, length), = tfrecord.scan(handle, fs.size(f"{root}/{shards[0].path}"))
        example = tf_example_pb2.Example.FromString(tfrecord.read_record(handle, offset, length))
    del example.features.feature["steps/is_first"].int64_list.value[-1]  # 2 values where every other step feature has 3
    with open(tmp_path / "one.tfrecord", "wb") as handle:
        tfrecord.write_records(handle, [example.SerializeToString()])
    data = example.SerializeToString()
    with pytest.raises(FormatError) as raised:
        Reader(*storage.open_root(str(tmp_path)), meta).load(RecordRef("train", 0, 0, "one.tfrecord", 12, len(data), "train_00000_000000"))
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/one\.tfrecord: train_00000_000000: record 0: step features disagree on the "
                        r"episode length: \{.*\} \.\.\.", str(raised.value)), str(raised.value)


def test_an_mp4_header_box_shorter_than_its_version_is_not_the_plain_case():
    """harness mp4: an mdhd saying version 1 in a version 0 box's 32 bytes was parsed, then
    write_cut's duration rewrite ran past it (struct.error, which the copy path does not catch)."""
    import io

    from formats import video
    from formats.video import mp4

    out = io.BytesIO()
    video.encode_frames([np.full((48, 64, 3), 40 * i, np.uint8) for i in range(4)], out, fps=10, options=video.EncodeOptions(codec="h264"))
    data = bytearray(out.getvalue())
    table = mp4.read_sample_table(io.BytesIO(bytes(data)))
    assert table is not None and len(table.sizes) == 4 and table.mdhd[8] == 0 and len(table.mdhd) == 32
    data[data.index(b"mdhd") + 4] = 1  # the version byte: 1 needs 44 bytes
    assert mp4.read_sample_table(io.BytesIO(bytes(data))) is None


@pytest.fixture(scope="module")
def ortf(tmp_path_factory):
    from formats.sources.ortf.sample import SyntheticORTF
    from formats.sources.ortf.sample import write_dataset as write_ortf

    path = tmp_path_factory.mktemp("fuzz_ortf") / "ds"
    write_ortf(str(path), SyntheticORTF(lengths=(3, 2), cameras=("cam_wrist",), slow_camera=None, depth_format=None, audio=False,
                                        annotations=True, urdf=False))
    return path


def test_an_ortf_task_line_nested_too_deeply(ortf, tmp_path):
    """harness ortf_json: tasks.jsonl's own json.loads let RecursionError escape."""
    from formats.sources import ortf as ortf_source

    root = tmp_path / "ds"
    shutil.copytree(ortf, root)
    (root / "meta/tasks.jsonl").write_text('{"task_id": 0, "instruction": "x"}\n' + "[" * 100_000 + "\n")
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/tasks.jsonl: line 2 is not a task object with a task_id: maximum recursion")):
        ortf_source.plan(fs, url, {})


def test_ortf_scene_objects_nested_too_deeply(ortf, tmp_path):
    """The same class in the other JSON ORTF reads on its own (annotations' scene_objects.json)."""
    from formats.sources import ortf as ortf_source

    root = tmp_path / "ds"
    shutil.copytree(ortf, root)
    objects = sorted(root.glob("annotations/*/scene_objects.json"))[0]
    objects.write_text("[" * 100_000)
    fs, url = storage.open_root(str(root))
    meta, refs = ortf_source.plan(fs, url, {})
    ref = next(ref for ref in refs if ref.annotations and ref.annotations in str(objects))
    with pytest.raises(FormatError, match=re.escape(f"{objects.parent}/scene_objects.json: malformed JSON: nested too deeply")):
        ortf_source.load(fs, url, ref, meta)


def _rlds_with_info(tmp_path, change) -> tuple:
    """The RLDS sample with its dataset_info.json edited by `change`: (fs, root)."""
    from formats.sources.rlds.sample import SyntheticRLDS
    from formats.sources.rlds.sample import write_dataset as write_rlds

    write_rlds(str(tmp_path / "ds"), SyntheticRLDS(splits={"train": (3, 2)}, shards={"train": 1}))
    info_path = tmp_path / "ds" / "dataset_info.json"
    info = json.loads(info_path.read_text())
    change(info)
    info_path.write_text(json.dumps(info))
    return storage.open_root(str(tmp_path / "ds"))


def test_an_rlds_split_whose_num_bytes_is_null_is_planned(tmp_path):
    """harness rlds_json: `"numBytes": null` passed the checks (null reads as absent) and then
    reached float(None) when sizing the shards (TypeError)."""
    from formats.sources import rlds

    fs, root = _rlds_with_info(tmp_path, lambda info: info["splits"][0].update({"numBytes": None}))
    meta, shards = rlds.plan(fs, root, {"fps": 10})
    assert [(shard.split, shard.records, shard.nbytes) for shard in shards] == [("train", 2, 0.0)]


def _mixtrain(path, sidecar: bytes = b'{"mixtrain": "1.0", "column_types": {}}', errors: bytes | None = None):
    path.mkdir()
    (path / "mixtrain.json").write_bytes(sidecar)
    if errors is not None:
        (path / "_errors.jsonl").write_bytes(errors)
    return path


def test_the_text_report_of_stats_whose_count_is_empty(tmp_path):
    """harness mixtrain_json: `"count": []` passes check_stats; render_text took count[0] (IndexError)."""
    pytest.importorskip("atheris", reason="the harness's sample conversion lives in fuzz/, which needs atheris")
    from formats.read import report
    from fuzz import fuzz_mixtrain_json

    fuzz_mixtrain_json.prepare(str(tmp_path))  # a real conversion of the LeRobot sample
    output = tmp_path / "mixtrain_output"
    stats = json.loads((output / "stats.json").read_text())
    stats["action"]["count"] = []
    (output / "stats.json").write_text(json.dumps(stats))
    dataset = reader.open_dataset(str(output))
    lines = report.render_text(report.summarize(dataset)).splitlines()
    assert "  action" in lines and not any(line.startswith("  action  (") for line in lines)


@pytest.mark.parametrize("line, kind", [(b"5", "int"), (b"[]", "list"), (b'"x"', "str")])
def test_an_errors_line_that_is_json_but_not_an_object(tmp_path, line, kind):
    """harness mixtrain_json: report.render_text called .get on it (AttributeError)."""
    root = _mixtrain(tmp_path / "out", errors=b'{"sequence_id": "a", "error": "e"}\n' + line + b"\n")
    dataset = reader.open_dataset(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{root}/_errors.jsonl: line 2 is not a JSON object (found {kind})")):
        dataset.errors()


def test_an_errors_line_nested_too_deeply(tmp_path):
    root = _mixtrain(tmp_path / "out", errors=b"[" * 100_000 + b"\n")
    with pytest.raises(FormatError, match=re.escape(f"{root}/_errors.jsonl: line 1: malformed JSON: nested too deeply")):
        reader.open_dataset(str(root)).errors()


def test_validate_reports_a_sidecar_that_is_not_utf8(tmp_path):
    """harness mixtrain_json: validate's own json.loads let UnicodeDecodeError escape."""
    root = _mixtrain(tmp_path / "out", sidecar=b'{"mixtrain": "1.0\x95"}')
    findings = validate.validate(str(root))
    assert len(findings) == 1 and findings[0].startswith(f"{root}/mixtrain.json: malformed JSON: 'utf-8' codec can't decode byte 0x95")


@pytest.mark.parametrize("name", ["\ud800.json", "st\x00ats.json"])
def test_a_stats_name_no_file_system_can_hold(tmp_path, name):
    """harness mixtrain_json: `"stats": "\\ud800"` reached os.stat (UnicodeEncodeError; a NUL: ValueError)."""
    sidecar = json.dumps({"mixtrain": "1.0", "column_types": {}, "stats": name}).encode()
    root = _mixtrain(tmp_path / "out", sidecar=sidecar)
    with pytest.raises(FormatError, match=re.escape(f"stats {name!r} is not a valid file name (a NUL or an unpaired surrogate)")):
        reader.open_dataset(str(root)).stats()
    with pytest.raises(FormatError, match=re.escape(f"stats {name!r} is not a valid file name")):
        validate.validate(str(root))


def test_a_ragged_statistic_is_refused_where_stats_json_is_read(tmp_path):
    """harness mixtrain_json (a 10-minute run after the session's fixes): a `mean` whose rows differ
    in length passed check_stats, and the text report's np.ravel raised ValueError."""
    from formats.mixtrain.schema import check_stats

    with pytest.raises(FormatError, match=r"stats.json: action.mean is a ragged list \(its rows differ in length\)"):
        check_stats({"action": {"mean": [[0.5, 1.0], [2.0]], "count": [3]}}, "stats.json")
    check_stats({"video": {"mean": [[[0.5]], [[0.25]], [[0.125]]], "count": [3]}}, "stats.json")  # [C, 1, 1] images still pass


def test_a_trajectory_dim_beyond_arrows_fixed_size_list(tmp_path):
    """harness mixtrain_json (a one-hour run): `"dim": 2**63` passed check_sidecar as a positive
    integer, and validate's expected cell type raised OverflowError in pa.list_."""
    from mixtrain_convert import convert

    write_lerobot(str(tmp_path / "in"), SyntheticLeRobot(lengths=(3,)))
    assert convert([f"--input={tmp_path / 'in'}", f"--output={tmp_path / 'out'}", "--runner=FnApiRunner", "--progress=off"]) == 0
    sidecar_path = tmp_path / "out" / "mixtrain.json"
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["column_types"]["action"]["dim"] = 2**63
    sidecar_path.write_text(json.dumps(sidecar))
    message = re.escape("column_types.action.dim must be a positive integer below 2**31 (an Arrow fixed-size list's limit), "
                        "found 9223372036854775808")
    with pytest.raises(FormatError, match=message):
        validate.validate(str(tmp_path / "out"))
    with pytest.raises(FormatError, match=message):
        reader.open_dataset(str(tmp_path / "out"))


def test_a_video_fps_beyond_a_floats_range(tmp_path):
    """by hand, the class of the `dim` case above: `"fps": 10**400` passed check_sidecar as a
    positive number, and `Dataset.decode` raised OverflowError in `float(fps)`."""
    from mixtrain_convert import convert

    write_lerobot(str(tmp_path / "in"), SyntheticLeRobot(lengths=(3,)))
    assert convert([f"--input={tmp_path / 'in'}", f"--output={tmp_path / 'out'}", "--runner=FnApiRunner", "--progress=off"]) == 0
    sidecar_path = tmp_path / "out" / "mixtrain.json"
    sidecar = json.loads(sidecar_path.read_text())
    camera = next(name for name, entry in sidecar["column_types"].items() if entry["type"] == "video")
    sidecar["column_types"][camera]["fps"] = 10**400
    sidecar_path.write_text(json.dumps(sidecar))
    with pytest.raises(FormatError, match=re.escape(f"column_types.{camera}.fps must be a positive number, found 1000")):
        reader.open_dataset(str(tmp_path / "out")).decode("x.mp4", camera)


def test_an_ortf_sensor_named_by_an_object(ortf, tmp_path):
    """harness ortf_json (a one-hour run): a sensor whose `name` is an object passed the manifest
    check and was made a dict key (TypeError: unhashable type)."""
    from formats.sources import ortf as ortf_source

    root = tmp_path / "ds"
    shutil.copytree(ortf, root)
    manifest = json.loads((root / "meta/manifest.json").read_text())
    manifest["sensors"][0]["name"] = {"a": 1}
    (root / "meta/manifest.json").write_text(json.dumps(manifest))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/manifest.json: sensors[0].name must be a string, found dict")):
        ortf_source.plan(fs, url, {})


# By hand, the class the sidecar's dim and fps above opened (fuzz/jsonmut.py now mutates to 10**400 too):
# a JSON integer past a float's range, which float() and math.isfinite answer with OverflowError.
_PAST_FLOAT = 10**400


def test_a_lerobot_fps_past_a_floats_range(lerobot, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["fps"] = _PAST_FLOAT
    (root / "meta/info.json").write_text(json.dumps(info))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: 'fps' must be a positive number of frames per second, found 1000")):
        lerobot_v3.plan(fs, url, {})


@pytest.mark.parametrize("where", ["sensor", "control_frequency_hz"])
def test_an_ortf_rate_past_a_floats_range(ortf, tmp_path, where):
    from formats.sources import ortf as ortf_source

    root = tmp_path / "ds"
    shutil.copytree(ortf, root)
    manifest = json.loads((root / "meta/manifest.json").read_text())
    if where == "sensor":
        manifest["sensors"][0]["fps"] = _PAST_FLOAT
        expected = "sensors[0].fps must be a positive number, found 1000"
    else:
        manifest["action_space"]["control_frequency_hz"] = _PAST_FLOAT
        expected = "action_space.control_frequency_hz must be a positive number, found 1000"
    (root / "meta/manifest.json").write_text(json.dumps(manifest))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/manifest.json: {expected}")):
        ortf_source.plan(fs, url, {})


@pytest.mark.parametrize("value", [_PAST_FLOAT, -5, "\u00b2", "9" * 5_000], ids=["past_int64", "negative", "superscript", "5000_digits"])
def test_an_rlds_num_bytes_that_is_no_int64_count(tmp_path, value):
    """A count past int64 (float overflow sizing the shards), a negative one (accepted), a
    superscript digit (str.isdigit says yes, int() raises) and 5,000 digits (past int()'s limit)."""
    from formats.sources import rlds

    fs, root = _rlds_with_info(tmp_path, lambda info: info["splits"][0].update({"numBytes": value}))
    with pytest.raises(FormatError, match=re.escape(f"{root}/dataset_info.json: splits[0].numBytes must be a non-negative integer, found")):
        rlds.plan(fs, root, {"fps": 10})


def test_an_rlds_file_format_that_is_not_a_string(tmp_path):
    """harness rlds_json (a one-hour run): `"fileFormat": [...]` reached `in CONTAINERS` (TypeError: unhashable)."""
    from formats.sources import rlds

    fs, root = _rlds_with_info(tmp_path, lambda info: info.update({"fileFormat": ["tfrecord"]}))
    with pytest.raises(FormatError, match=re.escape(f"{root}/dataset_info.json: fileFormat must be a string, found ['tfrecord']")):
        rlds.plan(fs, root, {"fps": 10})


def _lerobot_with_camera_info(tmp_path, change) -> tuple:
    root = tmp_path / "ds"
    write_lerobot(str(root), SyntheticLeRobot(lengths=(3,)))
    meta = json.loads((root / "meta/info.json").read_text())
    camera = next(key for key, spec in meta["features"].items() if spec["dtype"] == "video")
    change(meta["features"][camera])
    (root / "meta/info.json").write_text(json.dumps(meta))
    return root, camera


@pytest.mark.parametrize("info, message", [
    ("h264", "has info 'h264'; expected an object"),  # harness lerobot_json (a one-hour run): AttributeError on str.get
    ({"video.is_depth_map": "false"}, "has info.video.is_depth_map 'false'; expected true or false"),  # bool("false"): depth
])
def test_a_lerobot_camera_info_that_is_not_what_lerobot_writes(tmp_path, info, message):
    root, camera = _lerobot_with_camera_info(tmp_path, lambda spec: spec.update(info=info))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: feature {camera!r} {message}")):
        lerobot_v3.plan(fs, url, {})


@pytest.mark.parametrize("info, key, found, extra", [
    ({"video.fps": _PAST_FLOAT}, "fps", "a positive number, found 1000", []),
    ({"video.fps": None}, "fps", "a positive number, found None", []),
    ({"video.width": "640"}, "resolution", "an object with positive integer width and height below 2**31, found", []),
    ({"video.pix_fmt": 5}, "pix_fmt", "a string, found 5", ["--video=reencode"]),  # was TypeError in the encode policy
])
def test_camera_metadata_mixtrain_json_cannot_hold_is_refused_at_planning(tmp_path, capsys, info, key, found, extra):
    """By hand, after the review: values a source's metadata puts in a column reached mixtrain.json,
    which our own reader then refused. The plan is checked as mixtrain.json will hold it."""
    from mixtrain_convert import convert

    root, camera = _lerobot_with_camera_info(tmp_path, lambda spec: spec["info"].update(info))
    code = convert([f"--input={root}", f"--output={tmp_path / 'out'}", "--runner=FnApiRunner", "--progress=off", *extra])
    error = capsys.readouterr().err.strip()
    column = column_name(camera, camera=True)
    assert code == 1 and not (tmp_path / "out").exists() and "\n" not in error
    assert error.startswith(f"error: {root} (lerobot_v3 metadata, as mixtrain.json would hold it): "
                            f"column_types.{column}.{key} must be {found}"), error


def test_lerobot_names_as_an_object_of_one_list_are_the_list(tmp_path):
    """lerobot v2.x (and datasets converted from it) write names as {"motors": [...]}: kept verbatim,
    mixtrain.json held an object our reader refuses (names must be a list of strings)."""
    from formats.read import reader as dataset_reader
    from mixtrain_convert import convert

    root = tmp_path / "ds"
    write_lerobot(str(root), SyntheticLeRobot(lengths=(3,), cameras=()))
    meta = json.loads((root / "meta/info.json").read_text())
    dims = meta["features"]["action"]["shape"][0]
    meta["features"]["action"]["names"] = {"motors": [f"joint_{i}" for i in range(dims)]}
    meta["features"]["observation.state"]["names"] = {"a": ["x"], "b": ["y"]}  # not one list: kept as it was, elsewhere
    (root / "meta/info.json").write_text(json.dumps(meta))
    assert convert([f"--input={root}", f"--output={tmp_path / 'out'}", "--runner=FnApiRunner", "--progress=off"]) == 0
    column_types = dataset_reader.open_dataset(str(tmp_path / "out")).column_types
    assert column_types["action"]["names"] == [f"joint_{i}" for i in range(dims)]
    assert "names" not in column_types["obs_state"]
    assert column_types["obs_state"]["source_names"] == {"a": ["x"], "b": ["y"]}


def test_a_shard_listed_as_the_dataset_folder(tmp_path):
    """harness mixtrain_json (a one-hour run): `"shards": ["."]` opened the dataset's folder as a
    shard (OSError from Arrow); a folder named by any metadata is now refused before opening it."""
    root = _mixtrain(tmp_path / "out", sidecar=b'{"mixtrain": "1.0", "column_types": {}, "shards": ["."]}')
    with pytest.raises(FormatError, match=re.escape(f"{root}/.: is a folder, not a file")):
        reader.open_dataset(str(root)).scan()


@pytest.mark.parametrize("task_id, found", [("Infinity", "inf"), ("2.7", "2.7"), ('"3"', "'3'")])
def test_an_ortf_task_id_that_is_not_an_integer(ortf, tmp_path, task_id, found):
    """harness ortf_json (a one-hour run): `"task_id": Infinity` overflowed int(); 2.7 was read as
    task 2 (another task's instruction on the episode), silently."""
    from formats.sources import ortf as ortf_source

    root = tmp_path / "ds"
    shutil.copytree(ortf, root)
    (root / "meta/tasks.jsonl").write_text('{"task_id": ' + task_id + ', "instruction": "x"}\n')
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/tasks.jsonl: line 1: task_id must be an integer, found {found}")):
        ortf_source.plan(fs, url, {})


@pytest.mark.parametrize("episode_id, number", [("12", 12), ("1700000000000000000", 1700000000000000000), ("\u00b2", 4),
                                               ("9" * 5_000, 4), ("9" * 19, 4), ("ep-3", 4)])
def test_an_ortf_episode_id_that_only_looks_numeric(episode_id, number):
    """By hand, the class of RLDS's "²" count: an episode id str.isdigit accepts and int() refuses
    (a superscript digit; 5,000 digits, past int()'s limit) names the video by the episode's row."""
    from formats.sources import ortf as ortf_source

    assert ortf_source._episode_number({"episode_id": episode_id}, 4) == number


def test_a_sidecar_count_past_int64(tmp_path):
    """By hand, the 10**400 class: `num_sequences` passed as a non-negative integer, and
    `len(dataset)` raised OverflowError (a count must fit an index)."""
    root = _mixtrain(tmp_path / "out", sidecar=json.dumps({"mixtrain": "1.0", "column_types": {}, "num_sequences": _PAST_FLOAT}).encode())
    with pytest.raises(FormatError, match=re.escape("num_sequences must be a non-negative integer below 2**63, found 1000")):
        len(reader.open_dataset(str(root)))


@pytest.mark.parametrize("line, message", [
    ('{"task_id": 0, "instruction": {"text": "x"}}', "line 1: instruction must be a string, found {'text': 'x'}"),
    ('{"task_id": 0, "instruction": "x", "type": 7}', "line 1: type must be a string, found 7"),
    ('{"task_id": 3.0, "instruction": "x"}', None),  # a float column's to_json: task 3
])
def test_ortf_task_fields_become_string_columns(ortf, tmp_path, line, message):
    """Review of the fuzz fixes: an instruction that is not a string passed planning and loading and
    failed in the shard writer (ArrowTypeError), which --on_error=skip cannot skip."""
    from formats.sources import ortf as ortf_source

    root = tmp_path / "ds"
    shutil.copytree(ortf, root)
    (root / "meta/tasks.jsonl").write_text(line + "\n")
    fs, url = storage.open_root(str(root))
    if message is None:
        assert ortf_source._tasks(fs, url) == {3: {"task_id": 3.0, "instruction": "x"}}
        return
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/tasks.jsonl: {message}")):
        ortf_source.plan(fs, url, {})


def test_a_statistic_past_a_floats_range_in_the_html_report(tmp_path):
    """Review of the fuzz fixes: stats.json's numbers were any integers; the HTML report's float()
    of 10**400 raised OverflowError. Refused where stats.json is read (check_stats)."""
    from formats.mixtrain.schema import check_stats

    with pytest.raises(FormatError, match=re.escape("stats.json: action.mean must be")):
        check_stats({"action": {"mean": [_PAST_FLOAT], "count": [3]}}, "stats.json")
    check_stats({"action": {"mean": [float("nan"), 2**62], "count": [3]}}, "stats.json")  # NaN read back, and big finite ints, pass


def test_an_rlds_file_path_template_that_reads_an_attribute(tmp_path):
    """harness rlds_json (a 13-minute run): `{SPLIT.LIFE}` in filepathTemplate: str.format looked the
    attribute up on the split's name (AttributeError)."""
    from formats.sources import rlds

    fs, root = _rlds_with_info(tmp_path, lambda info: info["splits"][0].update({"filepathTemplate": "{SPLIT.LIFE}-{SHARD_INDEX}"}))
    with pytest.raises(FormatError, match=re.escape(f"{root}/dataset_info.json: splits[0].filepathTemplate '{{SPLIT.LIFE}}-{{SHARD_INDEX}}' "
                                                    "is not a valid template: 'str' object has no attribute 'LIFE'")):
        rlds.plan(fs, root, {"fps": 10})


def test_an_rlds_file_path_template_width_is_refused_before_it_is_filled(tmp_path):
    """`{SHARD_INDEX:0>300000000}` made a 300-million-character name (1.9 GB) before anything noticed."""
    import resource

    from formats.sources import rlds

    fs, root = _rlds_with_info(tmp_path, lambda info: info["splits"][0].update({"filepathTemplate": "{SHARD_INDEX:0>300000000}"}))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FormatError, match=re.escape(f"{root}/dataset_info.json: splits[0].filepathTemplate '{{SHARD_INDEX:0>300000000}}' "
                                                    "is not a valid template: the field 'SHARD_INDEX' asks for a width of more than 255")):
        rlds.plan(fs, root, {"fps": 10})
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KB: nothing of the claimed size was made


@pytest.mark.parametrize("shape", [[6], [1]])
def test_a_lerobot_dtype_numpy_cannot_encode(lerobot, tmp_path, shape):
    """harness lerobot_json (a 2-minute run): `"dtype": "\\ud800"` made np.dtype raise
    UnicodeEncodeError (a ValueError), which the dtype checks did not catch."""
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["new_feature"] = {"dtype": "\ud800", "shape": shape}  # in no data file: no data type to compare with
    (root / "meta/info.json").write_text(json.dumps(info))
    fs, url = storage.open_root(str(root))
    if shape == [6]:
        with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: feature 'new_feature' has unknown dtype '\\ud800'")):
            lerobot_v3.plan(fs, url, {})
    else:  # a per-step value of a type numpy does not know: the data file's own type decides, and it has none
        with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: feature 'new_feature' is declared in info.json "
                                                        "but missing from the data files")):
            lerobot_v3.plan(fs, url, {})


def test_a_shard_name_longer_than_a_file_system_takes(tmp_path):
    """harness mixtrain_json (a 17-minute run): a shard named by 5,000 characters reached open(),
    which raised OSError (ENAMETOOLONG). Refused where any metadata path is resolved."""
    root = _mixtrain(tmp_path / "out", sidecar=json.dumps({"mixtrain": "1.0", "column_types": {}, "shards": ["a" * 5000]}).encode())
    with pytest.raises(FormatError, match=re.escape(f"shard {'a' * 60!r}... (5000 characters) is not a valid file name "
                                                    "(a part longer than 255 bytes)")):
        reader.open_dataset(str(root)).scan()


def test_a_lerobot_trajectory_dtype_arrow_does_not_hold(lerobot, tmp_path):
    """harness lerobot_json (a 35-minute run): a dtype numpy knows and Arrow does not ("V8", a
    void) passed the feature parser and raised ArrowNotImplementedError building the column."""
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["action"]["dtype"] = "V8"
    (root / "meta/info.json").write_text(json.dumps(info))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: feature 'action' has unknown dtype 'V8'")):
        lerobot_v3.plan(fs, url, {})


def test_a_lerobot_shape_whose_product_overflows_a_float(lerobot, tmp_path):
    """harness lerobot_json (a 30-minute run): a shape of 10**200 x 10**200 was refused, but its
    message formatted the product as a float (OverflowError)."""
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["action"]["shape"] = [10**200, 10**200]
    (root / "meta/info.json").write_text(json.dumps(info))
    fs, url = storage.open_root(str(root))
    with pytest.raises(FormatError, match=re.escape(f"{url}/meta/info.json: feature 'action' has shape [10000")):
        lerobot_v3.plan(fs, url, {})


SPARSE_CASES = {  # format -> (the metadata file, what the one line says)
    "lerobot_v3": ("meta/info.json", r"\d+ bytes is not plausible for a JSON metadata file \(at most 67108864\)"),
    "lerobot_v2": ("meta/episodes.jsonl", r"line \d+ is longer than 16777216 bytes: not a line of text"),
    "ortf": ("meta/tasks.jsonl", r"line \d+ is longer than 16777216 bytes: not a line of text"),
}


@pytest.mark.parametrize("format_", sorted(SPARSE_CASES))
def test_a_sparse_metadata_file_is_refused_by_what_it_holds_not_by_what_it_claims(tmp_path, format_):
    """A metadata file of a few KB on disk extended to 900 MB (sparse: zeros no disk holds) was read
    whole (2.5 GB peak for a 2.5 GB claim). Planning refuses it in one line, holding at most one line."""
    from formats import samples

    relative, message = SPARSE_CASES[format_]
    samples.get(format_).small(str(tmp_path / "ds"))
    path = tmp_path / "ds" / relative
    with open(path, "ab") as handle:
        handle.truncate(900 << 20)
    script = ("import sys\nfrom formats import sources, storage\nfs, root = storage.open_root(sys.argv[1])\n"
              "try:\n    sources.get(sys.argv[2]).plan(fs, root, {})\nexcept Exception as error:\n    print(error)\n"
              # VmHWM: this program's own peak (ru_maxrss counts the forking parent's size too)
              "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ds"), format_], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    error, peak = done.stdout.splitlines()
    assert re.fullmatch(rf"{re.escape(str(path))}: {message}", error), error
    assert int(peak) < 400_000, peak  # KB
