"""The package Dataflow workers install with --setup_file ./setup.py (and `pip install .` here)."""

import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', Path(__file__).with_name("formats").joinpath("__init__.py").read_text()).group(1)

# The Beam version lives in BEAM_VERSION and only there: this package, the launcher and the SDK
# container image (Dockerfile, --build-arg BEAM_VERSION="$(cat BEAM_VERSION)") must agree.
BEAM_VERSION = Path(__file__).with_name("BEAM_VERSION").read_text().strip()

LAKE = ["pyiceberg[sql-sqlite,pyarrow]>=0.12,<0.13", "deltalake>=1.6,<2"]
LANCE = ["pylance>=14.0.2,<15"]
# s3fs pins fsspec to its own release and, through aiobotocore, botocore to a few patch releases:
# an extra, so that a user's boto3 is not held to that window unless s3:// is wanted. 2026.9.0 is
# verified beside fsspec 2026.9.0 and gcsfs 2026.10.1 (pip check clean).
S3 = ["s3fs>=2026.9.0,<2027"]
DUCKDB = "1.5.5"
# --runner=DaskRunner (pipelines/dask_runner.py): Beam's [dask] extra asks dask and distributed >= 2024.4.2;
# 2026.8 verified beside apache-beam 2.77 (pip check clean). The launcher and every worker need it.
DASK = ["dask[distributed]>=2024.4.2,<2027", "distributed>=2024.4.2,<2027"]

setup(
    name="mixtrain-convert",
    version=VERSION,
    description="Apache Beam pipeline converting robot-learning datasets to Mixtrain v1.0",
    packages=find_packages(include=["formats", "formats.*", "transforms", "transforms.*", "pipelines", "pipelines.*", "mixtrain_convert"]),
    python_requires=">=3.10",
    install_requires=[
        # [gcp]: the DataflowRunner, GCS I/O and job submission for the launcher (the SDK container has them).
        f"apache-beam[gcp]=={BEAM_VERSION}",
        # >=23: a list column's write batches end on whole rows (Arrow GH-47030), which the shard
        # writer's row-by-row pages rest on (formats/mixtrain shard_writer; tests/formats/test_mixtrain.py).
        "pyarrow>=23,<26",
        "numpy>=1.26,<2.5",
        "av>=14,<19",
        "fsspec>=2024.6",
        "gcsfs>=2024.6",
        "tensorflow-datasets>=4.9.7,<5",
        # L5Kit zarr chunks (blosc): zarr-python 3 cannot read its structured dtypes, see formats/sources/l5kit/zarr_v2.py.
        "numcodecs>=0.13,<0.17",
        # TFRecord checksums (RLDS) without TensorFlow: the C crc32c gcsfs already uses.
        "google-crc32c>=1.5",
        # RLDS in ArrayRecord shards (TFDS file_format=array_record): google's reader (tensorflow-datasets pulls it in
        # on Linux only, with the same marker); zstandard decodes a remote shard's footer (apache-beam needs it too).
        "array_record>=0.8,<1; platform_system == 'Linux'",
        "zstandard>=0.18",
    ],
    # polars, duckdb, pandas: the published-layout test reads every output the way users' tools do.
    # torch: only for formats.read.reader's optional Dataset/IterableDataset wrappers.
    # lake: --table_format=iceberg (pyiceberg, its SQLite SQL catalog) and delta (delta-rs); imported only when used.
    # lance: --table_format=lance (pylance 14.0.2 verified beside apache-beam 2.77, pip check clean).
    # test: duckdb pinned to the version of the duckdb-extension-* wheels, which carry the iceberg/avro/delta
    # extension binaries (DuckDB's own INSTALL downloads them, which fails offline).
    # hub: --input=hf://datasets/<owner>/<name> through huggingface_hub's fsspec filesystem.
    # s3: s3:// (AWS S3, MinIO, Ceph) through s3fs. test: moto's S3 server (server mode) for the s3:// tests.
    extras_require={"torch": ["torch>=2.1"],
                    "hub": ["huggingface_hub>=0.24"],
                    "lake": LAKE,
                    "lance": LANCE,
                    "s3": S3,
                    "dask": DASK,
                    # atheris: the coverage-guided fuzzer of fuzz/ (tests/test_fuzz_smoke.py runs every harness briefly,
                    # and skips where it is missing). Its wheels are for Linux x86_64 and Python 3.11-3.13 only; elsewhere it
                    # builds from source with a clang that ships libFuzzer, so it is not asked for there.
                    # pytest-xdist: the suite runs its test files on the machine's cores (at most 4 processes).
                    # pytest-timeout: a test stuck past its limit fails with every thread's stack instead of stalling the run.
                    "test": ["pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.3", "ruff>=0.6",
                             "atheris==3.0.0; sys_platform == 'linux' and platform_machine == 'x86_64' and python_version >= '3.11' "
                             "and python_version < '3.14'",
                             "pillow>=10", "gcp-storage-emulator>=2024.8", "polars>=1.0",
                             "pandas>=2.0", *LAKE, *LANCE, *S3, "moto[server]>=5.1,<6", *DASK,
                             f"duckdb=={DUCKDB}", *(f"duckdb-extension-{name}=={DUCKDB}" for name in ("iceberg", "avro", "delta"))]},
    entry_points={"console_scripts": ["mixtrain-convert=pipelines.convert:main", "mixtrain-validate=pipelines.validate:entry",
                                      "mixtrain-inspect=pipelines.inspect:entry", "mixtrain-export=pipelines.export:main"]},
)
