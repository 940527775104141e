"""vitflash.files.written_whole: whole files, with the mode a plain open() gives."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vitflash.files import written_whole


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_written_file_has_open_s_mode_and_no_leftovers(tmp_path):
    (tmp_path / "plain").write_bytes(b"")  # what open() gives under this process's umask
    with written_whole(tmp_path / "cache.npz") as tmp:
        assert Path(tmp).parent == tmp_path and tmp.endswith(".npz")
        Path(tmp).write_bytes(b"new")
    assert (tmp_path / "cache.npz").read_bytes() == b"new"
    assert _mode(tmp_path / "cache.npz") == _mode(tmp_path / "plain")  # not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.npz", "plain"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"):
        with written_whole(target, suffix=".tmp") as tmp:
            Path(tmp).write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
