"""The publish step compares what arrived with the plan: a runner (or a DoFn) that loses elements
makes the run fail with one line, the output left as it was, never a short dataset published."""

import hashlib
import json

import pytest

from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import convert
from transforms import read, staged_plan


def _digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _losing(monkeypatch, lose):
    """The load step with the refs for which `lose(ref)` holds dropped from its batches, as a
    faulty runner would drop their elements (however the refs were batched)."""
    process = read._LoadSequenceFn.process

    def dropping(self, batch, *args, **kwargs):
        refs = staged_plan.unpack(batch) if isinstance(batch, bytes) else batch
        return process(self, [ref for ref in refs if not lose(ref)], *args, **kwargs)

    monkeypatch.setattr(read._LoadSequenceFn, "process", dropping)


def _error(capsys) -> str:
    """The run's error line without the hint that follows it when the run completed sequences (kept
    for the same command to resume: tests/pipelines/test_resume.py)."""
    err = capsys.readouterr().err
    return "".join(line for line in err.splitlines(keepends=True) if not line.startswith("(the sequences it completed are kept in "))


def _left(folder) -> list[str]:
    """What a failed run left in `folder`, but the staging kept for a resumption (a journal in it)."""
    return sorted(p.name for p in folder.iterdir() if not (p / "_resume" / "done").is_dir())


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_lost_work_fails_with_one_line_and_leaves_the_published_dataset(multi_file_dataset, tmp_path, capsys, monkeypatch, on_error):
    src, _ = multi_file_dataset
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off"]) == convert.EXIT_OK
    before = _digest(dst)
    capsys.readouterr()
    # Episodes 2 and 3 never reach the load step.
    _losing(monkeypatch, lambda ref: ref.sequence_id in ("episode_000002", "episode_000003"))
    code = convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--overwrite", f"--on_error={on_error}"])
    err = _error(capsys)
    assert code == convert.EXIT_FAILED
    assert err == (f"error: {dst}: 5 of 7 planned sequences reached the publish step (lost: episode_000002 and 1 more); 5 converted, "
                   "0 skipped: the runner lost work; nothing was published\n")
    assert _digest(dst) == before
    assert _left(tmp_path) == ["out"]  # no staging left beside it but what a rerun resumes


def test_lost_work_into_a_new_output_creates_nothing(multi_file_dataset, tmp_path, capsys, monkeypatch):
    src, _ = multi_file_dataset
    _losing(monkeypatch, lambda ref: ref.sequence_id == "episode_000006")
    dst = tmp_path / "new" / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off"]) == convert.EXIT_FAILED
    assert _error(capsys) == (f"error: {dst}: 6 of 7 planned sequences reached the publish step (lost: episode_000006); "
                      "6 converted, 0 skipped: the runner lost work; nothing was published\n")
    assert _left(tmp_path / "new") == [] and not dst.exists()  # the folder made for it holds only the work kept to resume


def _rlds_without_shard_lengths(tmp_path):
    src = tmp_path / "rlds" / "1.0.0"
    write_rlds(str(src), SyntheticRLDS(splits={"train": (3, 4, 5, 3, 6)}, shards={"train": 2}))
    info = json.loads((src / "dataset_info.json").read_text())
    info["splits"][0]["numShards"] = str(len(info["splits"][0].pop("shardLengths")))
    (src / "dataset_info.json").write_text(json.dumps(info))
    return src


def test_sequences_counted_on_workers_are_checked_too(tmp_path, capsys, monkeypatch):
    """RLDS shards without shardLengths: the plan cannot count their episodes; each shard's count
    comes from the worker that indexed it, and an episode lost after that is caught."""
    src = _rlds_without_shard_lengths(tmp_path)
    _losing(monkeypatch, lambda ref: ref.sequence_id == "train_00001_000000")
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--fps=10"]) == convert.EXIT_FAILED
    assert _error(capsys) == (f"error: {dst}: 4 of 5 planned sequences reached the publish step; 4 converted, 0 skipped: "
                                       "the runner lost work; nothing was published\n")
    assert not dst.exists()


def test_a_unit_that_never_reports_its_count_is_caught(tmp_path, capsys, monkeypatch):
    src = _rlds_without_shard_lengths(tmp_path)
    process = read._ExpandRefFn.process

    def without_tally(self, ref):  # a runner that loses the tagged output of one shard
        for item in process(self, ref):
            if not (getattr(item, "tag", None) == read.TALLIES and ref.position == 0):
                yield item

    monkeypatch.setattr(read._ExpandRefFn, "process", without_tally)
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--fps=10"]) == convert.EXIT_FAILED
    assert _error(capsys) == (f"error: {dst}: 1 of 2 source units never reported how many sequences they hold; 5 converted, "
                                       "0 skipped: the runner lost work; nothing was published\n")
    assert not dst.exists()


def test_work_delivered_twice_fails_too(multi_file_dataset, tmp_path, capsys, monkeypatch):
    """Under --on_error=skip a duplicated sequence id is skipped as bad input; a runner that
    delivered a batch twice is not bad input and publishes nothing."""
    src, _ = multi_file_dataset
    process = read._LoadSequenceFn.process

    def twice(self, batch):  # episode 4's element delivered twice
        loaded = list(process(self, batch))
        return loaded + [sequence for sequence in loaded if getattr(sequence, "sequence_id", None) == "episode_000004"]

    monkeypatch.setattr(read._LoadSequenceFn, "process", twice)
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--on_error=skip", "--max_skipped=100%"]) == convert.EXIT_FAILED
    assert _error(capsys) == (f"error: {dst}: 8 sequences reached the publish step, 7 were planned; 6 converted, "
                                       "0 skipped: the runner delivered work twice; nothing was published\n")
    assert not dst.exists()


def test_one_sequence_lost_and_another_delivered_twice_is_not_taken_for_a_duplicate_id(multi_file_dataset, tmp_path, capsys,
                                                                                           monkeypatch):
    """The counts balance (one row too many, one too few), and under --on_error=skip the doubled id
    reads as two source episodes mapping to it: the planned ids are checked when the writer saw
    duplicates, and the lost one is named."""
    src, _ = multi_file_dataset
    process = read._LoadSequenceFn.process

    def lose_one_double_another(self, batch):
        loaded = [sequence for sequence in process(self, batch) if getattr(sequence, "sequence_id", None) != "episode_000002"]
        return loaded + [sequence for sequence in loaded if getattr(sequence, "sequence_id", None) == "episode_000004"]

    monkeypatch.setattr(read._LoadSequenceFn, "process", lose_one_double_another)
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--on_error=skip", "--max_skipped=100%"]) == convert.EXIT_FAILED
    assert _error(capsys) == (f"error: {dst}: 1 planned sequence(s) never reached the publish step (lost: episode_000002) "
                                       "while others arrived twice; 5 converted, 0 skipped: the runner lost work; nothing was published\n")
    assert not dst.exists()



def test_a_shard_written_twice_fails_too(multi_file_dataset, tmp_path, capsys, monkeypatch):
    """A runner that delivered a shard writer's result twice (two writers of one part file): the
    results and statistics are collected by one combine, which keeps both copies for the count."""
    from transforms import write

    src, _ = multi_file_dataset
    process = write._WriteShardFn.process

    def twice(self, element):
        for result in process(self, element):
            yield result
            if result.index == 1:
                yield result

    monkeypatch.setattr(write._WriteShardFn, "process", twice)
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--num_shards=2"]) == convert.EXIT_FAILED
    err = _error(capsys)
    assert err.startswith(f"error: {dst}: ") and err.endswith("the runner delivered work twice; nothing was published\n"), err
    assert not dst.exists()


def test_lost_work_is_named_with_the_batches_dealt_to_several_workers(multi_file_dataset, tmp_path, capsys, monkeypatch):
    """Three local workers (threads here, so that the loss reaches them): a plan file per batch,
    and the publish step reads them all back to name what is missing."""
    src, _ = multi_file_dataset
    _losing(monkeypatch, lambda ref: ref.sequence_id == "episode_000005")
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--direct_num_workers=3",
                        "--direct_running_mode=multi_threading"]) == convert.EXIT_FAILED
    # (Beam's worker threads also log the failure here; the command line sends that to the run's log.)
    assert _error(capsys).splitlines()[-1] == (f"error: {dst}: 6 of 7 planned sequences reached the publish step (lost: "
                                                        "episode_000005); 6 converted, 0 skipped: the runner lost work; nothing was "
                                                        "published")
    assert not dst.exists()


@pytest.mark.parametrize("table_format", ["parquet", "delta"])
def test_a_run_reported_done_that_published_nothing_fails(multi_file_dataset, tmp_path, capsys, monkeypatch, table_format):
    """A runner that ends without error but never ran the publish step (a DaskRunner whose scheduler
    died did): exit 1 and one line, not the previous dataset's numbers as this run's."""
    from transforms import write

    src, _ = multi_file_dataset
    dst = tmp_path / "out"
    extra = [f"--table_format={table_format}"]
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra]) == convert.EXIT_OK
    before = _digest(dst)
    capsys.readouterr()
    monkeypatch.setattr(write._PublishFn, "process", lambda self, *args, **kwargs: iter(()))
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--overwrite", *extra]) == convert.EXIT_FAILED
    captured = capsys.readouterr()
    assert "converted" not in captured.out
    error = _error_from(captured.err)
    assert error == f"error: {dst}: the runner reported the run done, but its publish step never ran; nothing was published"
    after = _digest(dst)
    assert {name: after.get(name) for name in before} == before  # (a lake table also keeps the run's folder, to resume it)


def _error_from(err: str) -> str:
    (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
    return line
