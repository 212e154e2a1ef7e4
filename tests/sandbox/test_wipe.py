"""The plain-mode job-area wipe (``_worker.wipe_tree``) on trees built directly by the test.

Built with directory file descriptors, so the trees can be deeper than any path can name. Checked: everything
below the top directory is gone (the top stays), nothing outside is touched (symlinks are never followed,
fifos never opened), no recursion (it runs under a recursion limit a few frames above the caller's depth),
no descriptor left open, and the permission repairs work for a non-root owner (a forked child
that switches to ``nobody`` when the tests run as root).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from populora_env.sandbox._worker import wipe_tree


def _build(top: Path, depth: int, *, files_per_level: int = 1, chmod0: bool = False) -> None:
    """A chain ``d/d/d/...`` of ``depth`` levels under ``top``; each level gets files, a fifo, symlinks out
    of the tree (to ``/``, to ``..``, to the canary next to ``top``) and a hard link; with ``chmod0`` every
    directory and file ends with mode 0."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    opened = []
    try:
        for _level in range(depth):
            for i in range(files_per_level):
                os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
            os.mkfifo("fifo", dir_fd=fd)
            os.symlink("/", "root", dir_fd=fd)
            os.symlink("..", "up", dir_fd=fd)
            os.symlink(str(top.parent / "canary"), "canary", dir_fd=fd)
            os.link("f0", "hard", src_dir_fd=fd, dst_dir_fd=fd)
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            opened.append(fd)
            fd = child
            if len(opened) > 64:  # keep few descriptors open while building
                os.close(opened.pop(0))
    finally:
        os.close(fd)
        for o in opened:
            os.close(o)
    if chmod0:  # walk down again by descriptors, then up through '..', taking every permission away
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(depth):
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        for _ in range(depth):
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.fchmod(fd, 0)
            os.close(fd)
            os.chmod("f0", 0, dir_fd=parent)
            fd = parent
        os.close(fd)


def _nfds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _wipe_without_recursion(path: Path) -> None:
    """Call wipe_tree with a recursion limit a few frames above the current depth: any recursion per
    level would raise RecursionError."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 30)
    try:
        wipe_tree(str(path))
    finally:
        sys.setrecursionlimit(old)


def _scratch() -> Path:
    """A scratch directory on a tmpfs (/dev/shm) when there is one: building big trees on a disk under load
    takes minutes."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="populora-wipe-", dir=base))


def _remove(where: Path) -> None:
    """Remove a scratch directory even when a failed test left a deep tree there (shutil.rmtree would not)."""
    if where.exists():
        wipe_tree(str(where))
        where.rmdir()


@pytest.fixture
def area():
    where = _scratch()
    (where / "canary").write_text("canary")
    top = where / "area"
    top.mkdir()
    yield top
    _remove(where)


def test_deep_tree_with_links_fifos_and_symlinks(area: Path) -> None:
    _build(area, 1500, files_per_level=2)  # 'd/' x 1500: longer than PATH_MAX
    before = _nfds()
    _wipe_without_recursion(area)
    assert _nfds() == before
    assert os.listdir(area) == []
    assert (area.parent / "canary").read_text() == "canary"  # symlinks to it were removed, not followed


def test_permissions_taken_away_as_non_root() -> None:
    """Every directory mode 0 (unreadable, unsearchable), files mode 0, owner not root: the wipe restores
    the owner's permissions on the way down. Run by a child as ``nobody`` when the test runs as root (root
    would bypass the permission checks this is about)."""
    where = _scratch()
    os.chmod(where, 0o777)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                top = where / "area"
                top.mkdir()
                (where / "canary").write_text("canary")
                _build(top, 1200, chmod0=True)
                os.chmod(top, 0)
                try:
                    os.listdir(top)
                    code = 3  # the permissions were not taken away: the test would prove nothing
                except PermissionError:
                    _wipe_without_recursion(top)
                    code = 0 if os.listdir(top) == [] and (where / "canary").read_text() == "canary" else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    finally:
        _remove(where)


def test_many_files_flat_and_nested(area: Path) -> None:
    for d in range(20):
        sub = area / f"d{d}"
        sub.mkdir()
        fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)
        for i in range(1000):
            os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
        os.close(fd)
    _wipe_without_recursion(area)
    assert os.listdir(area) == []


@pytest.mark.slow
def test_hundreds_of_thousands_of_files(area: Path) -> None:
    """300,000 files in a flat directory plus 1,000 nested directories of 100."""
    fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(300_000):
        os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    for d in range(1000):
        os.mkdir(f"d{d}", dir_fd=fd)
        sub = os.open(f"d{d}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        for i in range(100):
            os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=sub))
        os.close(sub)
    os.close(fd)
    _wipe_without_recursion(area)
    assert os.listdir(area) == []
