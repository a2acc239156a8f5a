"""``programs.which``: the file ``exec`` runs. Where ``shutil.which`` answers the same question (a
non-empty ``PATH``) the two agree; an empty or missing ``PATH`` is searched as ``Popen`` searches it."""

import os
import shutil
import subprocess
import sys

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
       entries=st.lists(ENTRIES, min_size=1, max_size=5).filter(any),
       program=st.sampled_from(["prog", "a/prog", "./c/prog", "nope"]))
def test_which_finds_what_shutil_finds(tmp_path_factory, layout, entries, program):
    root = str(tmp_path_factory.mktemp("which"))
    _make(root, layout)
    path = os.pathsep.join(os.path.join(root, e) if e not in ("", "./b") else e for e in entries)
    here = os.getcwd()
    os.chdir(root)  # an empty entry and a relative program are looked up here
    try:
        assert which(program, {"PATH": path}) == shutil.which(program, path=path)
    finally:
        os.chdir(here)


def test_an_empty_or_missing_path_is_searched_as_popen_searches_it(tmp_path):
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o755)
    ran = subprocess.run(["tool"], env={"PATH": ""}, cwd=tmp_path, capture_output=True, text=True)
    assert ran.stdout == "ran\n"  # Popen: an empty PATH is the current directory
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert which("tool", {"PATH": ""}) == "tool"
    finally:
        os.chdir(here)
    assert which("sh", {}) == next(os.path.join(d, "sh") for d in os.defpath.split(os.pathsep)
                                   if os.path.isfile(os.path.join(d, "sh")))


def test_without_an_environment_it_reads_this_process(monkeypatch, tmp_path):
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.path.dirname(sys.executable)}")
    assert which("tool") == shutil.which("tool") == str(tmp_path / "tool")
