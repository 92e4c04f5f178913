"""The contract every harness enforces on one input, and the seeds' working folder.

For each input the code under test may return anything or raise a `formats.errors.ConversionError`
(the product's own error family, which the command line prints as one `error: ...` line); any
other exception escapes to atheris and is a crash. On top of that:

- time: an input that takes more than `TIME_LIMIT_S` (1 s of CPU time) raises `ContractViolation`
  (libFuzzer's own `-timeout`, 10 s of wall time, catches inputs that never return);
- memory: the process's address space is capped (`resource.RLIMIT_AS`) at what it uses after a
  warm-up pass over the seeds plus `MEMORY_LIMIT` (256 MiB), so an input that makes the parser
  allocate more gets a MemoryError. tracemalloc's peak check was measured at ~4x the cost per
  allocation, and a failed allocation is never traced; RLIMIT_AS works under atheris with no
  overhead. A MemoryError the product turns into a ConversionError (codecs wrapped in
  `except Exception`) is still a violation: the error's causes are searched for one.
"""

from __future__ import annotations

import hashlib
import os
import resource
import time
from collections.abc import Callable

from formats.errors import ConversionError

TIME_LIMIT_S = 1.0
MEMORY_LIMIT = 256 << 20


class ContractViolation(Exception):
    """An input broke the harness contract without raising (too slow, hidden MemoryError)."""


def _hidden_memory_error(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MemoryError):
            return True
        error = error.__cause__ or error.__context__
    return False


def checked(one_input: Callable[[bytes], object], crashes: str | None = None) -> Callable[[bytes], None]:
    """`one_input` wrapped in the contract: only ConversionError may escape, within the limits.
    An input that breaks it is saved as `crashes` + `crash-<sha1>` (atheris 3.0 under a fork does
    not write it) before the exception goes on to atheris."""

    def test_one_input(data: bytes) -> None:
        try:
            _contract(one_input, data)
        except BaseException:
            if crashes is not None:
                with open(f"{crashes}crash-{hashlib.sha1(data).hexdigest()}", "wb") as handle:
                    handle.write(data)
            raise

    return test_one_input


def _contract(one_input: Callable[[bytes], object], data: bytes) -> None:
    start = time.process_time()  # CPU time: a long fuzz runs niced beside other work, and wall time would blame the input
    try:
        one_input(data)
    except ConversionError as error:
        if _hidden_memory_error(error):
            raise ContractViolation(f"a MemoryError surfaced as {type(error).__name__}: {error}") from error
    elapsed = time.process_time() - start
    if elapsed > TIME_LIMIT_S:
        raise ContractViolation(f"one input took {elapsed:.2f} s (limit {TIME_LIMIT_S} s)")


def virtual_memory() -> int:
    """This process's address space in bytes (VmSize)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def cap_memory(extra: int = MEMORY_LIMIT) -> int:
    """Cap the address space at what is mapped now plus `extra`; returns the cap. Arrow's thread
    pools are held at one thread first: each thread started after the cap reserves its stack and a
    malloc arena of address space, which on a many-core machine would read as the input's."""
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    limit = virtual_memory() + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return limit


def fixtures_dir() -> str | None:
    """../shared/fixtures relative to the repository, as the tests find it (None when absent)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(os.path.dirname(here), "shared", "fixtures")
    return path if os.path.isdir(path) else None
