"""Unit tests for what ``--preload auto`` learns: the ranks' import recorder (``launcher_imports``,
installed by the hooks' ``sitecustomize``, which still runs the one it shadows), the launcher's reader
of that record, and the memory left for standbys (cgroup v2 and v1 files, or the machine's)."""

import os
import subprocess
import sys

from launcher.supervision import standbylearn
from launcher.supervision.debugging import HOOKS_DIR
from launcher.supervision.standbylearn import ImportsLog


def _package(root):
    """``pkg`` imports its own ``pkg.sub`` and the outside ``other`` while imported; ``pkg.later()``
    imports ``pkg.lazy`` when called (as torch.optim imports torch._dynamo)."""
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text(
        "from pkg import sub\nimport other\n\ndef later():\n    import pkg.lazy\n")
    (root / "pkg" / "sub.py").write_text("")
    (root / "pkg" / "lazy.py").write_text("")
    (root / "other.py").write_text("")
    (root / "custom").mkdir()
    (root / "custom" / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")


def _run(tmp_path, code, record=True):
    _package(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), HOOKS_DIR, str(tmp_path / "custom")])}
    env.pop("LAUNCHER_IMPORTS_FILE", None)
    if record:
        env["LAUNCHER_IMPORTS_FILE"] = str(tmp_path / "imports.txt")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path))


def test_the_recorder_keeps_chain_starts_only(tmp_path):
    result = _run(tmp_path, "import pkg\npkg.later()\ntry:\n    import not_installed_anywhere\nexcept ImportError:\n"
                            "    pass\nimport pkg.sub\nprint(__import__('os').environ.get('SHADOWED_RAN'))\n")
    assert result.returncode == 0, result.stderr
    names = (tmp_path / "imports.txt").read_text().split()
    assert "pkg" in names and "other" in names and "pkg.lazy" in names and "not_installed_anywhere" in names
    assert "pkg.sub" not in names  # pkg's own import while pkg was being imported: importing pkg does it
    assert names.index("pkg") < names.index("other") < names.index("pkg.lazy")
    assert len(names) == len(set(names))
    assert result.stdout.split() == ["1"]  # the sitecustomize further on the path ran too


def test_without_the_variable_nothing_is_recorded_and_the_shadowed_sitecustomize_runs(tmp_path):
    result = _run(tmp_path, "import sys, os\nimport pkg\nprint(os.environ.get('SHADOWED_RAN'), "
                            "'launcher_imports' in sys.modules, type(sys.meta_path[0]).__name__)\n", record=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["1", "False"] and result.stdout.split()[2] != "ImportRecorder"
    assert not (tmp_path / "imports.txt").exists()


def test_imports_log_reads_complete_lines_once(tmp_path):
    path = tmp_path / "imports.txt"
    log = ImportsLog(str(path))
    assert log.read_new() == []  # not there yet
    path.write_bytes(b"torch\nnum")
    assert log.read_new() == ["torch"]
    with open(path, "ab") as fh:
        fh.write(b"py\ntorch._dynamo\n")
    assert log.read_new() == ["numpy", "torch._dynamo"]
    assert log.read_new() == []


def _cgroup(tmp_path, files):
    directory = tmp_path / "cg"
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return str(directory)


def test_cgroup_v2_figures_count_used_memory_without_inactive_page_cache(tmp_path):
    directory = _cgroup(tmp_path, {"memory.max": "8589934592\n", "memory.current": "3221225472\n",
                                   "memory.stat": "anon 100\ninactive_file 1073741824\nactive_file 5\n"})
    free, limit, where = standbylearn._figures(directory, ("memory.max", "memory.current", "inactive_file"))
    assert (free, limit) == (6 << 30, 8 << 30) and "in use 2048 MiB" in where


def test_cgroup_without_a_limit_gives_no_figures(tmp_path):
    v2 = _cgroup(tmp_path, {"memory.max": "max\n", "memory.current": "1\n", "memory.stat": ""})
    assert standbylearn._figures(v2, ("memory.max", "memory.current", "inactive_file")) is None
    v1 = _cgroup(tmp_path, {"memory.limit_in_bytes": "9223372036854771712\n"})
    assert standbylearn._figures(v1, ("memory.limit_in_bytes", "memory.usage_in_bytes", "x")) is None


def test_memory_directories_of_v2_and_v1():
    mountinfo = ("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
                 "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
                 "36 31 0:33 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n")
    own = "4:memory:/pods/abc\n1:cpu:/\n0::/job\n"
    found = standbylearn._memory_directories(mountinfo, own)
    assert [d for d, _files in found] == ["/sys/fs/cgroup/unified/job", "/sys/fs/cgroup/memory/pods/abc"]


def test_memory_room_keeps_a_margin(monkeypatch):
    monkeypatch.setattr(standbylearn, "_cgroup_free", lambda: (5 << 30, 10 << 30, "cgroup"))
    room, where = standbylearn.memory_room()
    assert room == (5 << 30) - (1 << 30) and "margin of 1024 MiB" in where
    monkeypatch.setattr(standbylearn, "_cgroup_free", lambda: None)
    monkeypatch.setattr(standbylearn, "_machine_free", lambda: (1 << 30, 1 << 30, "MemAvailable"))
    assert standbylearn.memory_room()[0] == (1 << 30) - standbylearn.MIN_MARGIN


def test_a_module_that_walks_the_environment_does_not_make_every_variable_count(tmp_path, monkeypatch):
    """networkx reads ``os.environ.items()`` at import: the standby counts only the lookups by name,
    or the per-attempt variables would count and no standby would ever match its rank."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("standby_boot", os.path.join(HOOKS_DIR, "launcher_standby.py"))
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)
    # The standby's own check counts this process's threads; pytest-xdist's worker has its own.
    monkeypatch.setattr(boot, "_threads", lambda: 1)
    (tmp_path / "walker.py").write_text("import os\nALL = dict(os.environ.items())\nCOPY = os.environ.copy()\n"
                                        "ONE = os.environ.get('WALKER_OPTION')\nTWO = os.environ['HOME']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    read = set()
    assert boot._import(["walker"], False, read) == ["walker"]
    assert read == {"WALKER_OPTION", "HOME"}


def test_the_recorder_shows_signs_of_life_while_a_package_imports_its_own_modules(tmp_path, monkeypatch):
    """``import torch`` is one name for all its seconds: every 50th import the recorder writes an empty
    line, which the reader skips but counts as the ranks still importing."""
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "__init__.py").write_text("".join(f"from big import m{i}\n" for i in range(120)))
    for i in range(120):
        (tmp_path / "big" / f"m{i}.py").write_text("")
    result = _run(tmp_path, "import big\n")
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "imports.txt").read_text().split("\n")
    assert "big" in lines and not any(line.startswith("big.") for line in lines)
    assert lines.count("") >= 120 // 50  # plus the final newline's
    log = ImportsLog(str(tmp_path / "imports.txt"))
    names = log.read_new()
    assert "big" in names and "" not in names and log.grew
    assert log.read_new() == [] and not log.grew
    with open(tmp_path / "imports.txt", "a") as fh:
        fh.write("\n")
    assert log.read_new() == [] and log.grew
