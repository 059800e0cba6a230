"""launch/run_dir.py: a runtime directory is reaped only when its creator is provably gone
(its lock is free) and it is this user's own, private, real directory."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relaykv.launch.run_dir import LOCK, PREFIX, RunDir, reap_stale

# A process that makes a runtime directory in argv[1], prints its path and waits.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from relaykv.launch.run_dir import RunDir
    print(RunDir.create(sys.argv[1]).path, flush=True)
    time.sleep(120)
    """
)


def _abandoned(parent: Path, name: str, mode: int = 0o700) -> Path:
    """A directory as a killed creator leaves it: a `lock` file nobody holds."""
    path = parent / f"{PREFIX}{name}"
    path.mkdir(mode=mode)
    path.chmod(mode)
    (path / LOCK).touch()
    (path / "kv-secret").write_text("secret")
    return path


def test_create_and_remove(tmp_path: Path) -> None:
    run_dir = RunDir.create(str(tmp_path))
    assert run_dir.path.name.startswith(PREFIX)
    assert stat.S_IMODE(run_dir.path.stat().st_mode) == 0o700
    assert [p.name for p in run_dir.path.iterdir()] == [LOCK]
    assert reap_stale(str(tmp_path)) == []  # its creator (this process) holds the lock
    run_dir.remove()
    run_dir.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_live_creators_directory_stays_and_a_killed_ones_goes(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        path = Path(holder.stdout.readline().strip())
        assert path.is_dir()
        assert reap_stale(str(tmp_path)) == [] and path.is_dir()
        holder.kill()
        holder.wait(timeout=30)
        assert path.is_dir()  # SIGKILL: nothing ran in the holder
        assert reap_stale(str(tmp_path)) == [path] and not path.exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_only_this_users_private_directories_with_a_lock_are_reaped(tmp_path: Path) -> None:
    dead = _abandoned(tmp_path, "dead")
    no_lock = tmp_path / f"{PREFIX}nolock"  # another program's, or one being created
    no_lock.mkdir(mode=0o700)
    shared = _abandoned(tmp_path, "shared", mode=0o755)
    target = _abandoned(tmp_path, "target")
    target = target.rename(tmp_path / "elsewhere")
    (tmp_path / f"{PREFIX}link").symlink_to(target)
    other = tmp_path / "relaykv-up-logs"  # not a runtime directory's name
    other.mkdir(mode=0o700)
    (other / LOCK).touch()
    assert reap_stale(str(tmp_path)) == [dead]
    assert not dead.exists()
    for kept in (no_lock, shared, target, tmp_path / f"{PREFIX}link", other):
        assert kept.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_another_users_directory_is_never_reaped(tmp_path: Path) -> None:
    theirs = _abandoned(tmp_path, "theirs")
    os.chown(theirs, 65534, 65534)
    mine_their_lock = _abandoned(tmp_path, "lock-not-mine")
    os.chown(mine_their_lock / LOCK, 65534, 65534)
    assert reap_stale(str(tmp_path)) == []
    assert theirs.exists() and mine_their_lock.exists()
