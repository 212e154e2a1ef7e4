"""Test plugin (``populora train --plugins tests/selfplay/fault_plugin.py``): ``kill -9`` the run at a chosen
instant of one checkpoint write.

``POPULORA_TEST_KILL="<point>@<step>"`` picks the instant; without it the plugin does nothing (a resumed run
reloads the plugins saved in ``config.json``, and each resume may name another point). Points, in the order
``selfplay.checkpoint.write_checkpoint`` reaches them:

* ``tmp_created``: the temporary directory exists, nothing is written in it;
* ``mid_population``: two of the population's members are saved, the others are not;
* ``before_done``: every file and ``MANIFEST.json`` are written, ``DONE`` is not;
* ``after_done``: ``DONE`` is written, the directory is not renamed to ``step_<n>`` yet;
* ``pruning``: the new checkpoint is in place and an old one is being deleted (half of its files are gone).

The process sends SIGKILL to its process group when it leads one (the test starts it with
``start_new_session=True``, so the sandbox workers die with it), else to itself.
"""

from __future__ import annotations

import os
import signal

POINTS = ("tmp_created", "mid_population", "before_done", "after_done", "pruning")


def _die() -> None:
    if os.getsid(0) == os.getpid():
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _install(point: str, step: int) -> None:
    if point not in POINTS:
        raise ValueError(f"POPULORA_TEST_KILL: unknown point {point!r} (known: {', '.join(POINTS)})")
    import selfplay.checkpoint as ck
    import selfplay.resume as rs
    from agents.population import LoRAPopulation

    armed = {"on": False, "saved": 0}
    write_checkpoint = rs.write_checkpoint

    def patched_write_checkpoint(run_dir, s, write, keep=2):
        if s != step:
            return write_checkpoint(run_dir, s, write, keep)
        armed["on"] = True
        if point == "tmp_created":
            return write_checkpoint(run_dir, s, lambda tmp: _die(), keep)
        return write_checkpoint(run_dir, s, write, keep)

    rs.write_checkpoint = patched_write_checkpoint

    if point == "mid_population":
        save = LoRAPopulation.save

        def patched_save(self, name, directory, dtype=None):
            out = save(self, name, directory, dtype)
            if armed["on"]:
                armed["saved"] += 1
                if armed["saved"] == 2:
                    _die()
            return out

        LoRAPopulation.save = patched_save
    elif point == "before_done":
        mark_done = ck._mark_done

        def patched_mark_done(tmp, s):
            if armed["on"]:
                _die()
            mark_done(tmp, s)

        ck._mark_done = patched_mark_done
    elif point == "after_done":
        publish = ck._publish

        def patched_publish(tmp, final):
            if armed["on"]:
                _die()
            publish(tmp, final)

        ck._publish = patched_publish
    elif point == "pruning":
        remove_tree = ck._remove_tree

        def patched_remove_tree(path):
            if armed["on"] and ".tmp_prune_" in path.name:
                files = sorted(p for p in path.rglob("*") if p.is_file())
                for p in files[: len(files) // 2]:
                    p.unlink()
                _die()
            remove_tree(path)

        ck._remove_tree = patched_remove_tree


_spec = os.environ.get("POPULORA_TEST_KILL")
if _spec:
    _point, _step = _spec.split("@")
    _install(_point, int(_step))
