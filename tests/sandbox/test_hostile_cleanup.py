"""Jobs that leave a job area the worker must restore: deep, unreadable, strange or huge trees.

The issue's case: a tree about 1,100 levels deep (mkdir + chdir) made ``shutil.rmtree`` raise RecursionError in
the worker, which then answered every later job with "crashed". Each tree below is made on a single-worker
pool, in the namespaced mode (a fresh tmpfs per job, unmounted afterwards) and in plain mode (a directory
wiped by an iterative walk). Afterwards, on the host: the same worker processes answer the next jobs
correctly, no job process is left, and the job area is empty (namespaced: the tmpfs unmounted and its mount
point empty; plain: the worker's job directory gone).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import textwrap
from pathlib import Path

import pytest

from populora_env.sandbox import Limits, Sandbox

from .conftest import assert_workers_clean

TREES: dict[str, str] = {
    # the case, plus a file at every level
    "deep_mkdir_chdir_1200": """
        for i in range(1200):
            os.mkdir('d')
            os.chdir('d')
            open('f', 'w').close()
        depth = 1200
        """,
    # every directory on the way made unreadable and unsearchable once the job is inside it
    "deep_chmod_0": """
        for i in range(1100):
            os.mkdir('d')
            os.chdir('d')
            open('f', 'w').close()
            os.chmod('f', 0)
            os.chmod('..', 0)
        os.chmod('.', 0)
        depth = 1100
        """,
    # deep, cheaply: renaming the chain under a new directory adds a level per rename
    "deep_by_rename_1500": """
        os.mkdir('top')
        for i in range(1500):
            os.mkdir('n')
            os.rename('top', 'n/top')
            os.rename('n', 'top')
        depth = 1500  # 'top/' x 1500: a path far longer than PATH_MAX (4096)
        """,
    # fifos (never opened by the wipe), symlinks out of the area and in loops, hard links, odd modes
    "fifos_symlinks_links_modes": """
        os.mkdir('a')
        for i in range(100):
            os.mkfifo(f'a/fifo{i}')
        os.chmod('a/fifo0', 0)
        for i, target in enumerate(('/', '..', '../..', '/tmp', '/proc/self/root', 'loop', 'a', '/nonexistent')):
            os.symlink(target, f'link{i}')
        os.symlink('loop', 'loop')
        open('a/file', 'w').write('x')
        for i in range(20):
            os.link('a/file', f'hard{i}')
        for mode in (0o1777, 0o2755, 0o100, 0o400, 0o200, 0):
            os.mkdir(f'm{mode:o}')
            open(f'm{mode:o}/inside', 'w').close()
            os.chmod(f'm{mode:o}', mode)
        depth = 1
        """,
    # many entries, wide and nested (up to the area's inode limit in the namespaced mode)
    "many_files": """
        depth = 0
        try:
            for d in range(40):
                os.mkdir(f'd{d}')
                for i in range(240):
                    open(f'd{d}/f{i}', 'w').close()
        except OSError:
            pass
        """,
}


def _code(body: str) -> str:
    return "import os\n" + textwrap.dedent(body).strip() + "\n"


@contextlib.contextmanager
def _plain_area_on_tmpfs():
    """Plain mode puts its job area under the temp directory; on /dev/shm (a tmpfs) when there is one, so the
    big trees take seconds instead of a minute on a loaded disk. The wipe is the same code either way."""
    old = tempfile.tempdir
    if os.access("/dev/shm", os.W_OK):
        tempfile.tempdir = "/dev/shm"
    try:
        yield
    finally:
        tempfile.tempdir = old


@pytest.fixture(scope="module", params=["bwrap", "plain"])
def one(request):
    """A single-worker pool in each mode, the host path of its job area (plain mode), its worker pids."""
    with _plain_area_on_tmpfs():
        box = Sandbox(workers=1, mode=request.param, limits=Limits(timeout_s=60.0))
    with box:
        if request.param == "plain":
            area = Path(box.run_one("import os", "os.getcwd()").value.strip("'"))
        else:
            area = None
        yield box, area, list(box.worker_pids)


def _restored(one) -> None:
    box, area, pids = one
    r = box.run_one("import os\ndef f(x):\n    return sorted(x)", "(f([3, 1, 2]), os.listdir('.'))",
                    "([1, 2, 3], [])")
    assert (r.status, r.value, r.match) == ("ok", "([1, 2, 3], [])", True)
    assert box.worker_pids == pids, "the worker was restarted"
    assert_workers_clean(box)
    if area is not None:  # plain mode: the job directory is gone and its parent (the worker's base) is empty
        assert not area.exists() and os.listdir(area.parent) == []


@pytest.mark.parametrize("name", list(TREES))
def test_tree_is_removed(name: str, one) -> None:
    box = one[0]
    r = box.run_one(_code(TREES[name]), "depth")
    assert r.status == "ok", r
    _restored(one)


def test_inode_limit_in_namespaced_mode() -> None:
    """The namespaced job area holds at most ``max_files`` entries (the tmpfs inode limit), exactly."""
    with Sandbox(workers=1, limits=Limits(timeout_s=60.0, max_files=3000)) as box:
        code = "import os\nn = 0\ntry:\n    while True:\n        os.mkdir(f'd{n}')\n        n += 1\nexcept OSError as e:\n" \
               "    err = e.errno"
        assert box.run_one(code, "(n, err)").value == "(3000, 28)"  # ENOSPC after max_files entries
        assert box.run_one("import os", "len(os.listdir('.'))").value == "0"


_UNTIL_KILLED = {
    # the case: files until the deadline (emptied and refilled when the area is full)
    "files": "import os\ni = 0\nwhile True:\n    try:\n        open(f'f{i}', 'w').close()\n    except OSError:\n"
             "        for n in os.listdir('.'):\n            os.unlink(n)\n    i += 1",
    # a chain deepened by renames until the deadline: in plain mode its wipe takes longer than making it did
    # (3.4 s after a 2 s job, measured under load 10), i.e. longer than the 2 s grace a job gets past its
    # deadline, which the old protocol charged the cleanup to
    "rename_chain": "import os\nos.mkdir('top')\nwhile True:\n    try:\n        os.mkdir('n')\n"
                    "        os.rename('top', 'n/top')\n        os.rename('n', 'top')\n    except OSError:\n        pass",
}


@pytest.mark.parametrize("mode", ["bwrap", "plain"])
def test_work_until_the_deadline_does_not_make_the_worker_unresponsive(mode: str) -> None:
    """Jobs that fill their area until they are killed at the deadline: each result is a timeout, the worker
    is not restarted (its cleanup runs after the answer, under its own budget), later jobs are right."""
    with _plain_area_on_tmpfs():
        box = Sandbox(workers=1, mode=mode, limits=Limits(timeout_s=3.0))
    with box:
        pids = box.worker_pids
        for name, job in _UNTIL_KILLED.items():
            r = box.run_one(job)
            assert r.status == "timeout" and r.error.startswith("time limit of 3 s"), (name, r)
            assert box.run_one("import os", "os.listdir('.')").value == "[]", name
            assert box.worker_pids == pids, name
        assert_workers_clean(box)


def test_worker_that_cannot_restore_itself_retires() -> None:
    """A worker whose own state changed (here: the host renices the fork server between two jobs) notices it
    after its next job, answers that job, and retires; the pool starts a fresh one at normal priority."""
    if os.geteuid() != 0:
        pytest.skip("renicing another user's process back needs root")
    with Sandbox(workers=1) as box:
        box.wait_clean()
        pids = box.worker_pids
        server = box.fork_server_pids[0]
        os.setpriority(os.PRIO_PROCESS, server, 7)
        r = box.run_one("", "'answered'")
        assert r.value == "'answered'"  # the job itself ran in a clean area: its result stands
        box.wait_clean()  # the retire notice arrives after the result: the worker is replaced
        assert set(box.worker_pids).isdisjoint(pids)
        new = box.fork_server_pids[0]
        assert os.getpriority(os.PRIO_PROCESS, new) == 0
        assert box.run_one("import os", "os.getpriority(os.PRIO_PROCESS, 0)").value == "0"
        assert_workers_clean(box)
