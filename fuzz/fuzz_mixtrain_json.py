"""Harness: Mixtrain's own metadata on the way back (mixtrain.json, stats.json, _errors.jsonl) as
`validate` (pipelines/validate.py), the reader (formats/read/reader.py, dataset.py) and the
report `inspect` prints and writes (formats/read/report.py) read them.

Input: a byte choosing the file and the mode (raw bytes, or structure-aware JSON edits from
fuzz/jsonmut.py) of a real conversion of the product's LeRobot sample, converted once per run.
Contract: `validate.validate`, `reader.open_dataset`, `Dataset.stats`/`errors`,
`report.summarize`, `report.render_text` and `report.render_html` (`inspect --html`, one sampled
sequence) raise nothing but ConversionError, within 1 s and
256 MiB per input (fuzz/contract.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os

from formats.read import reader, report
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from fuzz.surfaces import Surface
from mixtrain_convert import convert
from pipelines import validate

MAX_LEN = 20_000
SMOKE_RUNS = 120
FILES = ["mixtrain.json", "stats.json", "_errors.jsonl"]
_SURFACES: list[Surface] = []


def prepare(work: str) -> list[bytes]:
    sample, output = os.path.join(work, "mixtrain_source"), os.path.join(work, "mixtrain_output")
    write_dataset(sample, SyntheticLeRobot(lengths=(5, 4)))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = convert([f"--input={sample}", f"--output={output}", "--runner=FnApiRunner"])
    if status:
        raise RuntimeError(f"converting the sample for the mixtrain_json harness failed (exit status {status})")
    # One skipped sequence, as --on_error=skip records it, so _errors.jsonl has a real line to mutate.
    with open(os.path.join(output, "_errors.jsonl"), "a") as handle:
        handle.write(json.dumps({"sequence_id": "episode_000009", "source_file": f"{sample}/data/chunk-000/file-000.parquet",
                                 "stage": "load", "error": "episode 9: 12 rows, expected 14"}) + "\n")
    _SURFACES.append(Surface(output, FILES))
    return _SURFACES[0].seeds()


def one_input(data: bytes) -> None:
    surface = _SURFACES[0]
    change = surface.mutated(data)
    if change is None:
        return
    name, content = change
    surface.apply(name, content)
    try:
        validate.validate(surface.root)
        dataset = reader.open_dataset(surface.root)
        dataset.stats()
        dataset.errors()
        summary = report.summarize(dataset)
        report.render_text(summary)
        report.render_html(dataset, summary, samples=1, trajectory_samples=1)
    finally:
        surface.restore(name)
