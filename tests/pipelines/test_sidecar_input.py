"""A published dataset's metadata is input (issue 27, items 11 and 12): mixtrain.json and
stats.json with values of the wrong type, and a Delta table whose log is cut or lost, end on
every reading surface (the reader, validate, validate --deep, inspect, inspect --html) in one
`error:` line naming the file and the key, exit 1, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from formats.errors import FormatError
from formats.read import reader
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from pipelines import convert, inspect, validate

SPEC = SyntheticLeRobot(lengths=(8, 6), codec="h264", gop=None, episodes_per_video_file=2, cameras=("observation.images.front",))


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A real standalone conversion (bytes layout: its trajectory entries carry layout keys) and a Delta one."""
    base = tmp_path_factory.mktemp("sidecar_input")
    write_lerobot(str(base / "src"), SPEC)
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'dst'}", "--progress=off", "--array_layout=bytes"]) == 0
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'delta'}", "--progress=off", "--table_format=delta"]) == 0
    if importlib.util.find_spec("lance") is not None:
        assert convert.run([f"--input={base / 'src'}", f"--output={base / 'lance'}", "--progress=off", "--table_format=lance"]) == 0
    return base


# (file, key path, wrong value, the key as the message names it)
MUTATIONS = [
    ("mixtrain.json", ("column_types",), None, "column_types"),
    ("mixtrain.json", ("column_types",), ["action"], "column_types"),
    ("mixtrain.json", ("column_types", "action"), None, "column_types.action"),
    ("mixtrain.json", ("column_types", "action"), "trajectory", "column_types.action"),
    ("mixtrain.json", ("column_types", "action", "type"), 3, "column_types.action.type"),
    ("mixtrain.json", ("column_types", "action", "dim"), "6", "column_types.action.dim"),
    ("mixtrain.json", ("column_types", "action", "dim"), 0, "column_types.action.dim"),
    ("mixtrain.json", ("column_types", "action", "dim"), True, "column_types.action.dim"),
    ("mixtrain.json", ("column_types", "action", "dim"), 6.5, "column_types.action.dim"),
    ("mixtrain.json", ("column_types", "action", "dtype"), 32, "column_types.action.dtype"),
    ("mixtrain.json", ("column_types", "action", "dtype"), "float99", "column_types.action.dtype"),
    ("mixtrain.json", ("column_types", "action", "dtype"), "object", "column_types.action.dtype"),
    ("mixtrain.json", ("column_types", "action", "names"), 7, "column_types.action.names"),
    ("mixtrain.json", ("column_types", "action", "names"), [1, 2], "column_types.action.names"),
    ("mixtrain.json", ("column_types", "action", "units"), 5, "column_types.action.units"),
    ("mixtrain.json", ("column_types", "action", "layout"), "diagonal", "column_types.action.layout"),
    ("mixtrain.json", ("column_types", "action", "cell_shape"), "-1,6", "column_types.action.cell_shape"),
    ("mixtrain.json", ("column_types", "action", "cell_shape"), [-1, 7], "column_types.action.cell_shape"),
    ("mixtrain.json", ("column_types", "video_front", "fps"), "30", "column_types.video_front.fps"),
    ("mixtrain.json", ("column_types", "video_front", "fps"), 0, "column_types.video_front.fps"),
    ("mixtrain.json", ("column_types", "video_front", "fps"), None, "column_types.video_front.fps"),
    ("mixtrain.json", ("column_types", "video_front", "resolution"), "64x48", "column_types.video_front.resolution"),
    ("mixtrain.json", ("column_types", "video_front", "resolution", "width"), "64", "column_types.video_front.resolution"),
    ("mixtrain.json", ("column_types", "video_front", "resolution", "height"), -48, "column_types.video_front.resolution"),
    ("mixtrain.json", ("column_types", "video_front", "codec"), ["h264"], "column_types.video_front.codec"),
    ("mixtrain.json", ("column_types", "video_front", "is_depth_map"), "no", "column_types.video_front.is_depth_map"),
    ("mixtrain.json", ("num_sequences",), "2", "num_sequences"),
    ("mixtrain.json", ("num_sequences",), -1, "num_sequences"),
    ("mixtrain.json", ("num_timesteps",), 14.5, "num_timesteps"),
    ("mixtrain.json", ("shards",), "data/part-00000.parquet", "shards"),
    ("mixtrain.json", ("shards",), [0], "shards"),
    ("mixtrain.json", ("stats",), 5, "stats"),
    ("mixtrain.json", ("source",), "lerobot", "source"),
    ("mixtrain.json", ("source", "uri"), 5, "source.uri"),
    ("mixtrain.json", ("converter",), [], "converter"),
    ("mixtrain.json", ("converter", "options"), "fast", "converter.options"),
    ("mixtrain.json", ("created_at",), 20261126, "created_at"),
    ("mixtrain.json", ("non_finite_values",), {"action": "many"}, "non_finite_values.action"),
    ("stats.json", (), [1, 2], "expected a JSON object, found list"),
    ("stats.json", (), "stats", "expected a JSON object, found str"),
    ("stats.json", ("action",), None, "action"),
    ("stats.json", ("action",), [0.0], "action"),
    ("stats.json", ("action", "mean"), "0.5", "action.mean"),
    ("stats.json", ("action", "min"), {"0": 1}, "action.min"),
    ("stats.json", ("action", "max"), [["x"]], "action.max"),
    ("stats.json", ("action", "mean"), [], "action.mean"),
]
SURFACES = ["reader", "validate", "validate --deep", "inspect", "inspect --html"]


def _mutated(published, tmp_path, file: str, path: tuple, value) -> tuple:
    copy = tmp_path / "copy"
    shutil.copytree(published / "dst", copy)
    target = copy / file
    if not path:
        target.write_text(json.dumps(value))
        return copy, target
    document = json.loads(target.read_text())
    holder = document
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    target.write_text(json.dumps(document))
    return copy, target


def _read_everything(url: str) -> None:
    """What a training script does: open, statistics, a sequence, its frames."""
    dataset = reader.open_dataset(url)
    dataset.stats()
    first = dataset.sequence_ids()[0]
    dataset.sequence(first)
    dataset.frames(first, "video_front")


def _one_error_line(surface: str, root, tmp_path, capsys) -> str:
    """The surface's one error line (the reader's: its FormatError as a CLI prints it)."""
    if surface == "reader":
        with pytest.raises(FormatError) as raised:
            _read_everything(str(root))
        return f"error: {raised.value}"
    module, *options = surface.split()
    main = {"validate": validate.main, "inspect": inspect.main}[module]
    options = [f"--html={tmp_path / 'report.html'}" if option == "--html" else option for option in options]
    assert main([str(root), *options]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err[:-1]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("file, path, value, key", MUTATIONS, ids=[f"{m[0]}:{'.'.join(m[1]) or '(whole)'}={m[2]!r}" for m in MUTATIONS])
def test_a_sidecar_value_of_the_wrong_type_is_one_error_line_naming_the_file_and_key(published, tmp_path, capsys, surface, file, path,
                                                                                      value, key):
    root, target = _mutated(published, tmp_path, file, path, value)
    line = _one_error_line(surface, root, tmp_path, capsys)
    assert line.startswith(f"error: {target}: ") and key in line, line
    assert "Traceback" not in line and not (tmp_path / "report.html").exists()


def _cut_last_entry(log):
    entry = sorted(log.glob("*.json"))[-1]
    entry.write_bytes(entry.read_bytes()[:300])


def _empty_last_entry(log):
    sorted(log.glob("*.json"))[-1].write_bytes(b"")


def _lose_every_entry(log):
    for entry in log.glob("*.json"):
        entry.unlink()


def _garbage_entry(log):
    sorted(log.glob("*.json"))[-1].write_bytes(b"\x00\xff not json\n")


@pytest.mark.parametrize("surface", ["reader", "validate", "inspect", "inspect --html"])
@pytest.mark.parametrize("damage", [_cut_last_entry, _empty_last_entry, _lose_every_entry, _garbage_entry], ids=lambda d: d.__name__[1:])
def test_a_delta_log_cut_or_lost_is_one_error_line_naming_the_log(published, tmp_path, capsys, surface, damage):
    copy = tmp_path / "copy"
    shutil.copytree(published / "delta", copy)
    damage(copy / "_delta_log")
    line = _one_error_line(surface, copy, tmp_path, capsys)
    assert f"{copy / '_delta_log'}: the Delta log cannot be read" in line and line.startswith("error: "), line
    assert "\n" not in line and "Traceback" not in line and not (tmp_path / "report.html").exists()


# The same checks on a lake table's `mixtrain` property (what the reader and validate read there).
PROPERTY_MUTATIONS = [m for m in MUTATIONS if m[0] == "mixtrain.json" and m[1][0] in ("column_types", "num_sequences", "shards", "source")][::3]


def _mutated_property(published, tmp_path, path: tuple, value):
    copy = tmp_path / "copy"
    shutil.copytree(published / "delta", copy)
    entry = sorted((copy / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in entry.read_text().splitlines()]
    for action in actions:
        if "metaData" in action:
            document = json.loads(action["metaData"]["configuration"]["mixtrain"])
            holder = document
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = value
            action["metaData"]["configuration"]["mixtrain"] = json.dumps(document)
    entry.write_text("".join(json.dumps(action) + "\n" for action in actions))
    return copy


@pytest.mark.parametrize("surface", ["reader", "validate", "inspect"])
@pytest.mark.parametrize("file, path, value, key", PROPERTY_MUTATIONS,
                         ids=[f"{'.'.join(m[1])}={m[2]!r}" for m in PROPERTY_MUTATIONS])
def test_a_delta_property_value_of_the_wrong_type_is_one_error_line(published, tmp_path, capsys, surface, file, path, value, key):
    root = _mutated_property(published, tmp_path, path, value)
    line = _one_error_line(surface, root, tmp_path, capsys)
    assert line.startswith(f"error: {root} (delta table, property 'mixtrain'): ") and key in line, line


# Iceberg: the current metadata file cut, emptied or deleted, the manifest list deleted. The
# embedded catalog records absolute paths, so each damaged table is a conversion of its own.
ICEBERG_DAMAGES = {
    "metadata_cut": lambda root: _current_metadata(root).write_bytes(_current_metadata(root).read_bytes()[:200]),
    "metadata_emptied": lambda root: _current_metadata(root).write_bytes(b""),
    "metadata_lost": lambda root: _current_metadata(root).unlink(),
    "manifest_list_lost": lambda root: next((root / "metadata").glob("snap-*.avro")).unlink(),
}


def _current_metadata(root):
    return sorted((root / "metadata").glob("*.metadata.json"))[-1]


@pytest.fixture(scope="module")
def damaged_iceberg(published, tmp_path_factory):
    pytest.importorskip("pyiceberg")
    made = {}

    def make(damage: str):
        if damage not in made:
            root = tmp_path_factory.mktemp(f"iceberg_{damage}") / "table"
            assert convert.run([f"--input={published / 'src'}", f"--output={root}", "--progress=off", "--table_format=iceberg"]) == 0
            ICEBERG_DAMAGES[damage](root)
            made[damage] = root
        return made[damage]
    return make


# The reader and inspect read the run's shards the property lists, not the manifests: a lost
# manifest list is met by validate only (it reads the rows through the table).
ICEBERG_CASES = [(damage, surface) for damage in sorted(ICEBERG_DAMAGES) for surface in ("reader", "validate", "inspect", "inspect --html")
                 if damage != "manifest_list_lost" or surface == "validate"]


@pytest.mark.parametrize("damage, surface", ICEBERG_CASES)
def test_iceberg_metadata_cut_or_lost_is_one_error_line_naming_it(damaged_iceberg, tmp_path, capsys, surface, damage):
    root = damaged_iceberg(damage)
    line = _one_error_line(surface, root, tmp_path, capsys)
    assert f"{root / 'metadata'}: the Iceberg table's metadata cannot be read (" in line and line.startswith("error: "), line
    assert "\n" not in line and "Traceback" not in line and not (tmp_path / "report.html").exists()


# And on a Lance dataset's metadata (mixtrain.json and stats.json in its schema metadata).
LANCE_MUTATIONS = PROPERTY_MUTATIONS + [m for m in MUTATIONS if m[0] == "stats.json"][::2]


@pytest.mark.parametrize("surface", ["reader", "validate", "inspect"])
@pytest.mark.parametrize("file, path, value, key", LANCE_MUTATIONS,
                         ids=[f"{m[0]}:{'.'.join(m[1]) or '(whole)'}={m[2]!r}" for m in LANCE_MUTATIONS])
def test_a_lance_metadata_value_of_the_wrong_type_is_one_error_line(published, tmp_path, capsys, surface, file, path, value, key):
    lance = pytest.importorskip("lance")
    from formats.mixtrain.tables.lance import SIDECAR_KEY, STATS_KEY

    root = tmp_path / "copy"
    shutil.copytree(published / "lance", root)
    dataset = lance.dataset(str(root))
    metadata = {name.decode(): text.decode() for name, text in dataset.schema.metadata.items()}
    metadata_key = SIDECAR_KEY if file == "mixtrain.json" else STATS_KEY
    if path:
        document = json.loads(metadata[metadata_key])
        holder = document
        for part in path[:-1]:
            holder = holder[part]
        holder[path[-1]] = value
    else:
        document = value
    metadata[metadata_key] = json.dumps(document)
    dataset.update_schema_metadata(metadata, replace=True)
    line = _one_error_line(surface, root, tmp_path, capsys)
    assert line.startswith(f"error: file://{root} (Lance version 2 metadata") and key in line, line
