"""RLDS in ArrayRecord shards (TFDS file_format=array_record): the same episodes as from TFRecord,
on a local disk and on a remote filesystem (the sparse-file path), and every bad shard one error."""

import json
import pathlib
import shutil

import fsspec
import numpy as np
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sources import rlds
from formats.sources.rlds import arrayrecord, tfrecord
from formats.sources.rlds.sample import SyntheticRLDS, write_dataset

BRIDGE = pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "rlds" / "bridge_dataset" / "1.0.0"
SPEC = dict(splits={"train": (6, 4, 5), "val": (3,)}, shards={"train": 2, "val": 1}, depth_camera=True)


def _all(url, **options):
    fs, root = storage.open_root(str(url))
    meta, shards = rlds.plan(fs, root, {"fps": 10, **options})
    reader = rlds.RLDS().open(fs, root, meta)
    records = [record for shard in shards for record in reader.expand(shard)]
    return meta, shards, records, [reader.load(record) for record in records]


def _same_sequences(left, right):
    """Every value of every sequence equal, bit for bit (images: the stored JPEG/PNG bytes)."""
    assert [s.sequence_id for s in left] == [s.sequence_id for s in right]
    for a, b in zip(left, right):
        assert a.length == b.length and a.scalars == b.scalars and a.timestamp.tobytes() == b.timestamp.tobytes()
        assert a.trajectories.keys() == b.trajectories.keys() and a.steps.keys() == b.steps.keys() and a.videos.keys() == b.videos.keys()
        for name in a.trajectories:
            assert a.trajectories[name].dtype == b.trajectories[name].dtype
            assert a.trajectories[name].tobytes() == b.trajectories[name].tobytes()
        for name in a.steps:
            x, y = a.steps[name], b.steps[name]
            assert (x is None and y is None) or (x.tobytes() == y.tobytes() if isinstance(x, np.ndarray) else x.equals(y))
        for name in a.videos:
            assert a.videos[name].frames == b.videos[name].frames


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same synthetic episodes written as TFRecord and as ArrayRecord shards."""
    base = tmp_path_factory.mktemp("rlds_containers")
    paths = {}
    for file_format in ("tfrecord", "array_record"):
        paths[file_format] = base / file_format / "synthetic_rlds" / "1.0.0"
        write_dataset(str(paths[file_format]), SyntheticRLDS(file_format=file_format, **SPEC))
    return paths


def test_array_record_shards_give_the_tfrecord_dataset_s_sequences(both):
    meta_t, shards_t, records_t, tf_sequences = _all(both["tfrecord"])
    meta_a, shards_a, records_a, ar_sequences = _all(both["array_record"])
    assert [s.path for s in shards_a] == ["synthetic_rlds-train.array_record-00000-of-00002",
                                          "synthetic_rlds-train.array_record-00001-of-00002",
                                          "synthetic_rlds-val.array_record-00000-of-00001"]
    assert [(s.split, s.position, s.records) for s in shards_a] == [(s.split, s.position, s.records) for s in shards_t]
    assert [(r.sequence_id, r.offset, r.nbytes) for r in records_a][1:3] == [("train_00000_000001", 0, 0), ("train_00001_000000", 0, 0)]  # by index
    assert len(ar_sequences) == 4 and [s.length for s in ar_sequences] == [6, 4, 5, 3]
    _same_sequences(tf_sequences, ar_sequences)
    assert meta_a.columns == meta_t.columns
    assert {k: v for k, v in meta_a.source.items() if k not in ("file_format", "uri")} == \
        {k: v for k, v in meta_t.source.items() if k not in ("file_format", "uri")}
    assert (meta_t.source["file_format"], meta_a.source["file_format"]) == ("tfrecord", "array_record")


def test_shards_are_written_as_tfds_writes_them(both):
    """group_size:1 (tfds' ArrayRecordFileAdapter), the rest array_record's defaults."""
    from array_record.python.array_record_module import ArrayRecordReader

    shard = both["array_record"] / "synthetic_rlds-train.array_record-00000-of-00002"
    reader = ArrayRecordReader(str(shard))
    assert reader.writer_options_string() == "group_size:1,transpose:false,pad_to_block_boundary:false,zstd:3,window_log:20,max_parallelism:1"
    assert reader.num_records() == 2
    tf_shard = both["tfrecord"] / "synthetic_rlds-train.tfrecord-00000-of-00002"
    with open(tf_shard, "rb") as handle:
        spans = list(tfrecord.scan(handle, tf_shard.stat().st_size))
        assert reader.read_all() == [tfrecord.read_record(handle, *span) for span in spans]  # the same serialized Examples
    info = json.loads((both["array_record"] / "dataset_info.json").read_text())
    assert info["fileFormat"] == "array_record" and info["splits"][0]["shardLengths"] == ["2", "1"]


def test_a_remote_filesystem_reads_the_same_records_through_the_sparse_file(both, tmp_path):
    """memory:// stands for gs://, s3://, hf://: array_record opens OS paths only."""
    url = "memory://rlds_remote/synthetic_rlds/1.0.0"
    fs = fsspec.filesystem("memory")
    fs.put(str(both["array_record"]), "/rlds_remote/synthetic_rlds/1.0.0", recursive=True)
    try:
        _, _, _, remote = _all(url)
        _, _, _, local = _all(both["array_record"])
        _same_sequences(local, remote)
    finally:
        fs.rm("/rlds_remote", recursive=True)


@pytest.mark.parametrize("options", ["group_size:1", "group_size:3", "group_size:1,uncompressed", "group_size:2,transpose:true"])
def test_sparse_reader_finds_every_record_whatever_the_writer_options(tmp_path, options):
    """Records of 0..150 kB cross 64 KiB blocks; 3,000 of them make a footer that crosses blocks too."""
    rng = np.random.default_rng(1)
    records = [rng.integers(0, 256, int(n), np.uint8).tobytes() for n in rng.integers(0, 150_000, 30)] + [b"%d" % i for i in range(3000)]
    arrayrecord.write_records(str(tmp_path / "shard"), records, options)
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/sparse/shard", (tmp_path / "shard").read_bytes())
    try:
        cache: dict = {}
        assert arrayrecord.count(fs, "/sparse/shard", cache) == len(records)
        for index in (0, 1, 7, 29, 30, 1500, len(records) - 1):
            assert arrayrecord.read_record(fs, "/sparse/shard", index, cache) == records[index]
        assert len(cache) == 1  # the footer was read once
    finally:
        fs.rm("/sparse", recursive=True)


def _copy(both, tmp_path):
    path = tmp_path / "copy" / "1.0.0"
    shutil.copytree(both["array_record"], path)
    return path


VAL = "synthetic_rlds-val.array_record-00000-of-00001"


def _remote(path):
    """The copy on memory:// (the sparse-file path), and how to clean it up."""
    fs = fsspec.filesystem("memory")
    fs.put(str(path), "/hostile/1.0.0", recursive=True)
    return "memory://hostile/1.0.0", lambda: fs.rm("/hostile", recursive=True)


def _expand(url, split="val"):
    fs, root = storage.open_root(url)
    meta, shards = rlds.plan(fs, root, {"fps": 10, "splits": [split]})
    reader = rlds.RLDS().open(fs, root, meta)
    return reader, list(reader.expand(shards[0]))


@pytest.mark.parametrize("where", ["local", "remote"])
def test_shard_lengths_disagreeing_with_the_file(both, tmp_path, where):
    path = _copy(both, tmp_path)
    info = json.loads((path / "dataset_info.json").read_text())
    info["splits"][1]["shardLengths"] = ["4"]
    (path / "dataset_info.json").write_text(json.dumps(info))
    url, cleanup = _remote(path) if where == "remote" else (str(path), lambda: None)
    try:
        with pytest.raises(FormatError, match=rf"^{url.replace('memory://', '/')}/{VAL}: 1 records, dataset_info.json shardLengths says 4$"):
            _expand(url)
    finally:
        cleanup()


@pytest.mark.parametrize("where", ["local", "remote"])
@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:-10], r"not a readable ArrayRecord file: (Invalid Riegeli/records file: chunk boundary is .*; "
                              r"Failed to read RiegeliPostscript|its postscript chunk is truncated)$"),
    (lambda data: data[:40_000], r"not a readable ArrayRecord file: (ArrayRecord file should be at least 64KB big|"
                                 r"40000 bytes, less than the 64 KiB postscript)$"),
    (lambda data: data[:-65536 + 30] + b"\xff" + data[-65536 + 31:],  # in the postscript chunk's header hash
     r"not a readable ArrayRecord file: Corrupted Riegeli/records file: chunk header hash mismatch .*; Failed to read RiegeliPostscript$"),
], ids=["cut_10_bytes", "cut_to_40kB", "postscript_bit_flip"])
def test_truncated_or_corrupt_shard_is_refused_when_indexed(both, tmp_path, where, damage, message):
    path = _copy(both, tmp_path)
    shard = path / VAL
    shard.write_bytes(damage(shard.read_bytes()))
    url, cleanup = _remote(path) if where == "remote" else (str(path), lambda: None)
    try:
        with pytest.raises(FormatError, match=rf"^{url.replace('memory://', '/')}/{VAL}: val shard 0: {message}"):
            _expand(url)
    finally:
        cleanup()


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_flipped_byte_in_an_episode_names_the_file_and_the_episode(both, tmp_path, where):
    path = _copy(both, tmp_path)
    shard = path / VAL
    data = bytearray(shard.read_bytes())
    data[300] ^= 0xFF  # inside the first (only) episode's chunk
    shard.write_bytes(bytes(data))
    url, cleanup = _remote(path) if where == "remote" else (str(path), lambda: None)
    try:
        reader, records = _expand(url)  # the footer is intact: indexing works
        with pytest.raises(FormatError, match=rf"^{url.replace('memory://', '/')}/{VAL}: val_00000_000000: record 0: "
                                              r"Corrupted Riegeli/records file: chunk data hash mismatch"):
            reader.load(records[0])
    finally:
        cleanup()


def test_a_missing_shard_is_refused_at_plan(both, tmp_path):
    path = _copy(both, tmp_path)
    (path / VAL).unlink()
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=rf"^{path}/{VAL}: shard 0 of split 'val' not found \(from filepathTemplate "
                                          r"'\{DATASET\}-\{SPLIT\}.\{FILEFORMAT\}-\{SHARD_X_OF_Y\}'\)$"):
        rlds.plan(fs, root, {"fps": 10})


def test_tfrecord_files_under_an_array_record_info_are_refused(both, tmp_path):
    """dataset_info.json that names the wrong container: the shard does not open, nothing is guessed."""
    path = _copy(both, tmp_path)
    shutil.copy(both["tfrecord"] / "synthetic_rlds-val.tfrecord-00000-of-00001", path / VAL)
    with pytest.raises(FormatError, match=rf"/{VAL}: val shard 0: not a readable ArrayRecord file: "):
        _expand(str(path))


def bridge_as_array_record(destination: pathlib.Path) -> pathlib.Path:
    """The real bridge fixture's records rewritten into ArrayRecord shards as tfds writes them,
    with its dataset_info.json saying so (fileFormat; numBytes of the new files)."""
    destination.mkdir(parents=True)
    info = json.loads((BRIDGE / "dataset_info.json").read_text())
    info["fileFormat"] = "array_record"
    for split in info["splits"]:
        source = BRIDGE / f"bridge_dataset-{split['name']}.tfrecord-00000-of-00001"
        target = destination / f"bridge_dataset-{split['name']}.array_record-00000-of-00001"
        with open(source, "rb") as handle:
            records = [tfrecord.read_record(handle, *span) for span in tfrecord.scan(handle, source.stat().st_size)]
        assert arrayrecord.write_records(str(target), records) == int(split["shardLengths"][0])
        split["numBytes"] = str(target.stat().st_size)
    (destination / "dataset_info.json").write_text(json.dumps(info, indent=2))
    shutil.copy(BRIDGE / "features.json", destination / "features.json")
    return destination


def test_bridge_rewritten_as_array_record_reads_the_same_episodes(tmp_path):
    if not BRIDGE.is_dir():
        pytest.skip(f"real fixture not found at {BRIDGE} (../shared/fixtures is absent in a plain clone)")
    converted = bridge_as_array_record(tmp_path / "bridge_dataset" / "1.0.0")
    _, _, records, from_tfrecord = _all(BRIDGE)
    _, shards, _, from_array_record = _all(converted)
    assert [s.path for s in shards] == ["bridge_dataset-train.array_record-00000-of-00001", "bridge_dataset-val.array_record-00000-of-00001"]
    assert len(from_array_record) == 50
    _same_sequences(from_tfrecord, from_array_record)


def test_shards_of_the_other_container_are_named_not_read(both, tmp_path):
    """dataset_info.json saying tfrecord over ArrayRecord files (or the reverse): refused at plan with the file that is there."""
    path = _copy(both, tmp_path)
    info = json.loads((path / "dataset_info.json").read_text())
    info["fileFormat"] = "tfrecord"
    (path / "dataset_info.json").write_text(json.dumps(info))
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=r"^.*/synthetic_rlds-train.tfrecord-00000-of-00002: shard 0 of split 'train' not found "
                                          r"\(from filepathTemplate .*\); synthetic_rlds-train.array_record-00000-of-00002 exists, "
                                          r"but dataset_info.json says fileFormat 'tfrecord'$"):
        rlds.plan(fs, root, {"fps": 10})


def test_a_footer_claiming_gigabytes_decompressed_is_refused_before_allocating():
    import zstandard

    frame = zstandard.ZstdCompressor().compress(b"x" * 100)
    assert arrayrecord._decompress(b"\x64" + frame, ord("z"), "footer") == b"x" * 100  # 100 as a varint
    claim = bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01])  # 2**42 as a varint
    with pytest.raises(FormatError, match=r"^not a readable ArrayRecord file: its footer claims 4398046511104 bytes decompressed"):
        arrayrecord._decompress(claim + frame, ord("z"), "footer")


def test_a_footer_counting_more_records_than_the_file_has_bytes_is_refused(both, tmp_path, monkeypatch):
    """Riegeli's hashes are checksums a forger can recompute: the count is bounded by the file's size."""
    path = _copy(both, tmp_path)
    real_open = arrayrecord._open

    class Forged:
        def __init__(self, local):
            self._reader = real_open(local)

        def num_records(self):
            return 10**12

        def close(self):
            self._reader.close()

    monkeypatch.setattr(arrayrecord, "_open", Forged)
    size = (path / VAL).stat().st_size
    with pytest.raises(FormatError, match=rf"/{VAL}: val shard 0: not a readable ArrayRecord file: its footer counts "
                                          rf"1000000000000 records in {size} bytes$"):
        _expand(str(path))


def test_a_local_shard_stays_open_for_its_records_and_a_remote_footer_is_read_once(tmp_path, monkeypatch):
    """Opening a shard reads its footer: with a reader's cache, one open per shard for its records
    (one open per record made a shard's cost grow with the square of its records)."""
    paths = [tmp_path / f"s{i}.array_record" for i in range(2)]
    for i, path in enumerate(paths):
        arrayrecord.write_records(str(path), (f"{i}:{n}".encode() * 40 for n in range(50)))
    opened = []
    original = arrayrecord._open
    monkeypatch.setattr(arrayrecord, "_open", lambda local: opened.append(local) or original(local))
    fs, _ = storage.open_root(str(tmp_path))
    cache: dict = {}
    got = [arrayrecord.read_record(fs, str(path), n, cache) for path in paths for n in range(50)]
    assert got == [f"{i}:{n}".encode() * 40 for i in range(2) for n in range(50)]
    assert opened == [str(paths[0]), str(paths[1])]  # the second shard closed the first
    with pytest.raises(FormatError, match="record 50: the file holds 50 records"):
        arrayrecord.read_record(fs, str(paths[1]), 50, cache)
    assert arrayrecord.read_record(fs, str(paths[1]), 3, cache) == b"1:3" * 40 and len(opened) == 2
    memory = fsspec.filesystem("memory")
    memory.pipe("/ar/s0.array_record", paths[0].read_bytes())
    sizes = []
    monkeypatch.setattr(type(memory), "size", lambda self, path: sizes.append(path) or len(paths[0].read_bytes()))
    remote: dict = {}
    assert [arrayrecord.read_record(memory, "/ar/s0.array_record", n, remote) for n in (0, 7, 49)] == \
        [f"0:{n}".encode() * 40 for n in (0, 7, 49)]
    assert len(sizes) == 1  # the footer (and the size) fetched once for the shard's records


def test_make_sample_writes_the_rlds_sample_in_array_record_shards(tmp_path, capsys):
    """`python -m pipelines.make_sample DST --format=rlds --file_format=array_record`: the same
    episodes as the TFRecord sample, in ArrayRecord shards; the option is refused for other formats."""
    from pipelines import make_sample

    assert make_sample.main([str(tmp_path / "ar"), "--format=rlds", "--file_format=array_record", "--episodes=6"]) == 0
    assert make_sample.main([str(tmp_path / "tf"), "--format=rlds", "--episodes=6"]) == 0
    names = sorted(path.name for path in (tmp_path / "ar").iterdir())
    assert names == ["dataset_info.json", "features.json", "synthetic_rlds-train.array_record-00000-of-00001"]
    assert json.loads((tmp_path / "ar/dataset_info.json").read_text())["fileFormat"] == "array_record"
    _, _, _, got = _all(tmp_path / "ar")
    _, _, _, expected = _all(tmp_path / "tf")
    assert len(got) == 6
    _same_sequences(got, expected)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        make_sample.main([str(tmp_path / "lr"), "--file_format=array_record"])
    assert refused.value.code == 2 and capsys.readouterr().err.endswith(
        "error: --file_format has no effect with --format=lerobot_v3\n") and not (tmp_path / "lr").exists()


def test_a_record_that_inflates_like_a_bomb_is_refused_before_it_is_read(tmp_path):
    """Issue 41: a record whose zstd chunk of a few KB inflated to 800 MB was accepted at 2.6 GB
    peak. Its chunk header claims the size; one past 64 MiB claiming more than 100 times its stored
    bytes is refused before array_record allocates it, locally and through a remote store."""
    import resource

    local = str(tmp_path / "bomb.array_record")
    arrayrecord.write_records(local, [b"\0" * (80 << 20), b"an episode"])
    assert (tmp_path / "bomb.array_record").stat().st_size < 1 << 20
    fs = fsspec.filesystem("file")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FormatError, match=r"^record 0: its chunk claims 83886080 bytes decompressed from \d+ \(more than 100 "
                                          r"times, past 67108864\): a decompression bomb, not an episode$"):
        arrayrecord.read_record(fs, local, 0, {})
    assert arrayrecord.read_record(fs, local, 1, {}) == b"an episode"
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/bomb/shard.array_record", (tmp_path / "bomb.array_record").read_bytes())
    with pytest.raises(FormatError, match=r"^record 0: its chunk claims 83886080 bytes"):
        arrayrecord.read_record(memory, "/bomb/shard.array_record", 0, {})
    assert arrayrecord.read_record(memory, "/bomb/shard.array_record", 1, {}) == b"an episode"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 60_000  # KB: the 80 MB never made
