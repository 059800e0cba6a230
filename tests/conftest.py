"""Session setup shared by every test package.

One KV transfer secret for the whole session (docs/security.md): in-process engines, the
standalone peers and every `relaykv serve --role prefill|decode` a test starts read it
through `$RELAYKV_KV_SECRET_FILE`, as the engines of one `relaykv up` cluster do.

One OpenMP thread per process (`OMP_NUM_THREADS=1`, for the test process and every engine
it starts) unless the caller sets `OMP_NUM_THREADS` itself: the suite runs up to a dozen
torch processes at once on CI's 2 cores, where OpenMP's spinning workers turn each other's
load into slowdowns of 3-10x (tiny-hybrid's forced-preemption test: 5-18 s with the default
threads, 1.9 s with one; `benchmarks/sim_validate.py` pins its engines the same way). What
the tests compare is computed in the same configuration as its reference.

Byte-code caching on: `PYTHONDONTWRITEBYTECODE` is dropped for the test process and every
process it starts. With it set (as in some environments), every pytest session and xdist
worker rewrote and compiled each test module again (about 5 s of CPU per collection) and
every `relaykv` process a test starts compiled relaykv's modules again (about 0.5 s of CPU
each). The `.pyc` files go to the `__pycache__` folders git ignores.

`make test` runs the suite on two xdist workers, long files first (tests/file_order.py), then
the tests marked `exclusive` in a second, single-process session (tests/exclusive.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from relaykv.transfer.transport.wire.auth import SECRET_ENV, write_secret_file
from tests import exclusive, file_order

# At import, not in pytest_configure: the conftests of the paths on the command line (torch
# in tests/model/conftest.py) are imported before any pytest_configure runs.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    sys.dont_write_bytecode = False
if "torch" in sys.modules:  # imported by a plugin already: too late for the variable
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

_secret_dir: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _secret_dir
    exclusive.configure(config)
    if os.environ.get(SECRET_ENV):
        return
    _secret_dir = tempfile.mkdtemp(prefix="relaykv-test-secret-")
    os.environ[SECRET_ENV] = str(write_secret_file(os.path.join(_secret_dir, "kv-secret")))


def pytest_unconfigure(config: pytest.Config) -> None:
    exclusive.unconfigure()
    if _secret_dir is not None:
        shutil.rmtree(_secret_dir, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    file_order.longest_first(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Setup, call and teardown of `item` under the locks of tests/exclusive.py."""
    with exclusive.turn(item):
        return (yield)
