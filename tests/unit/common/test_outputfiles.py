"""The one way to create files where someone else may have planted something (``launcher.common.outputfiles``)."""

import os
import stat

import pytest

from launcher.common import outputfiles
from launcher.common.errors import UsageError
from launcher.common.outputfiles import private_dir, write_file


def test_write_file_replaces_a_planted_symlink_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out.html").symlink_to(victim)
    write_file(str(tmp_path / "out.html"), b"page")
    assert victim.read_text() == "keep"
    assert not (tmp_path / "out.html").is_symlink() and (tmp_path / "out.html").read_bytes() == b"page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html", "victim"]  # no temporary left


def test_write_file_tries_another_name_when_one_is_taken(tmp_path, monkeypatch):
    names = iter([b"taken!", b"free!!"])
    monkeypatch.setattr(outputfiles.os, "urandom", lambda n: next(names))
    (tmp_path / f".f.{b'taken!'.hex()}.tmp").symlink_to(tmp_path / "target")  # planted at the temporary name
    write_file(str(tmp_path / "f"), b"x")
    assert (tmp_path / "f").read_bytes() == b"x" and not (tmp_path / "target").exists()


def test_write_file_onto_a_directory_is_an_os_error_and_leaves_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        write_file(str(tmp_path / "d"), b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_private_dir_creates_0700(tmp_path):
    assert private_dir(str(tmp_path / "base"), "base dir")
    assert stat.S_IMODE((tmp_path / "base").stat().st_mode) == 0o700
    assert private_dir(str(tmp_path / "base"), "base dir")  # found again: fine
    assert not private_dir(str(tmp_path / "absent"), "base dir", create=False)


@pytest.mark.parametrize("make, problem", [
    (lambda p, t: p.symlink_to(t), "is a symlink: refused"),
    (lambda p, t: p.write_text(""), "is not a directory: refused"),
    (lambda p, t: (p.mkdir(), p.chmod(0o777)), "has mode 0777: refused"),
])
def test_private_dir_refuses_what_was_planted(tmp_path, make, problem):
    target = tmp_path / "theirs"
    target.mkdir(mode=0o700)
    planted = tmp_path / "base"
    make(planted, target)
    for create in (True, False):
        with pytest.raises(UsageError, match=problem):
            private_dir(str(planted), "base dir", create)
    assert list(target.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_private_dir_refuses_another_owner(tmp_path):
    theirs = tmp_path / "base"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UsageError, match="belongs to uid 65534"):
        private_dir(str(theirs), "base dir")
