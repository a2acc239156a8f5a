"""``programs.which`` against ``shutil.which``: the same answer on the same directories and ``PATH``."""

import os
import shutil

from hypothesis import HealthCheck, given, settings, strategies as st

from launcher.common.programs import which

#: What a directory may hold under the program's name.
KINDS = ("none", "exec", "plain", "dir", "link-exec", "link-dangling")
ENTRIES = st.sampled_from(["a", "b", "c", "", "missing", "a/", "./b"])


def _make(root: str, layout: dict) -> None:
    for name in ("a", "b", "c"):
        directory = os.path.join(root, name)
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, "prog")
        kind = layout[name]
        if kind in ("exec", "plain"):
            with open(target, "w") as fh:
                fh.write("#!/bin/sh\n")
            os.chmod(target, 0o755 if kind == "exec" else 0o644)
        elif kind == "dir":
            os.mkdir(target)
        elif kind == "link-exec":
            os.symlink("/bin/sh", target)
        elif kind == "link-dangling":
            os.symlink(os.path.join(root, "nowhere"), target)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.fixed_dictionaries({name: st.sampled_from(KINDS) for name in ("a", "b", "c")}),
       entries=st.lists(ENTRIES, max_size=5), program=st.sampled_from(["prog", "a/prog", "./c/prog", "nope"]))
def test_which_finds_what_shutil_finds(tmp_path_factory, layout, entries, program):
    root = str(tmp_path_factory.mktemp("which"))
    _make(root, layout)
    path = os.pathsep.join(os.path.join(root, e) if e not in ("", "./b") else e for e in entries)
    here = os.getcwd()
    os.chdir(root)  # an empty entry and a relative program are looked up here
    try:
        assert which(program, path) == shutil.which(program, path=path)
    finally:
        os.chdir(here)


def test_without_a_path_it_reads_the_environment(monkeypatch, tmp_path):
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert which("tool") == shutil.which("tool") == str(tmp_path / "tool")
    monkeypatch.delenv("PATH")
    assert which("sh") == shutil.which("sh")
