"""`@pytest.mark.exclusive`: a test that runs while no other test of the session runs.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadfile`: each test
file stays on one worker, in order, so a module's shared cluster is started once). A test
that compares measured times with a prediction, or bounds how fast a process reacts, would
measure the other worker's load too. Marked `exclusive`, it waits until the other worker's
current test has ended and holds that worker off until its own setup, call and teardown are
done. Without xdist (`pytest tests/x.py`) the mark changes nothing.

The locks keep other tests off, not the other worker's module-scoped clusters, which stay up
between its tests and still poll. `make test` therefore runs `-m "not exclusive"` on the
workers and then `-m exclusive` in a single-process session of its own.

Two flock(2) locks in a directory the controller makes for the run and hands to its workers
through `$RELAYKV_TEST_LOCK_DIR`:
* the gate: every test passes through it (takes it exclusively, lets go at once); an
  exclusive test holds it while it waits, because flock gives a waiting writer no priority
  over new readers and the other worker would otherwise start test after test;
* the run lock: every test holds it shared while it runs; an exclusive test holds it
  exclusively.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK_DIR_ENV = "RELAYKV_TEST_LOCK_DIR"
_made_here: str | None = None
_files: dict[str, int] = {}


def configure(config: pytest.Config) -> None:
    """In an xdist controller, make the lock directory for the workers (they are spawned
    after `pytest_configure` and inherit the environment). The mark is registered in
    pyproject.toml."""
    global _made_here
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        _made_here = tempfile.mkdtemp(prefix="relaykv-test-locks-")
        os.environ[LOCK_DIR_ENV] = _made_here


def unconfigure() -> None:
    if _made_here is not None:
        os.environ.pop(LOCK_DIR_ENV, None)
        shutil.rmtree(_made_here, ignore_errors=True)
    for fd in _files.values():
        os.close(fd)
    _files.clear()


def _fd(name: str) -> int:
    if name not in _files:
        path = Path(os.environ[LOCK_DIR_ENV]) / name
        _files[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    return _files[name]


@contextlib.contextmanager
def turn(item: pytest.Item) -> Iterator[None]:
    """Hold the locks `item`'s mark asks for while it runs (nothing outside an xdist run)."""
    if LOCK_DIR_ENV not in os.environ or not hasattr(item.config, "workerinput"):
        yield
        return
    gate, run = _fd("gate"), _fd("run")
    if item.get_closest_marker("exclusive") is None:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(run, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
        return
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        fcntl.flock(run, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)
