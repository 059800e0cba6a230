"""Session setup shared by every test package.

One KV transfer secret for the whole session (docs/security.md): in-process engines, the
standalone peers and every `relaykv serve --role prefill|decode` a test starts read it
through `$RELAYKV_KV_SECRET_FILE`, as the engines of one `relaykv up` cluster do.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from relaykv.transfer.transport.auth import SECRET_ENV, write_secret_file

_secret_dir: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _secret_dir
    if os.environ.get(SECRET_ENV):
        return
    _secret_dir = tempfile.mkdtemp(prefix="relaykv-test-secret-")
    os.environ[SECRET_ENV] = str(write_secret_file(os.path.join(_secret_dir, "kv-secret")))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _secret_dir is not None:
        shutil.rmtree(_secret_dir, ignore_errors=True)
