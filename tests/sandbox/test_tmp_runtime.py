"""A Python runtime that lives under /tmp (a CI checkout's venv, say) stays visible inside the namespaces."""

from __future__ import annotations

from populora_env.sandbox import isolation as iso


def test_private_tmp_is_mounted_before_the_runtime_binds() -> None:
    paths = ["/tmp/ci/main/.venv/lib/python3.11/site-packages"]
    cmd = iso.bwrap_command("bwrap", privileged=True, paths=paths)
    tmpfs = cmd.index("--tmpfs")
    assert cmd[tmpfs + 1] == "/tmp"
    binds = [i for i, a in enumerate(cmd) if a == "--ro-bind"]
    assert binds and all(i > tmpfs for i in binds)  # otherwise the tmpfs would hide a bind under /tmp
    assert "--tmpfs" not in cmd[tmpfs + 1:]  # mounted once
