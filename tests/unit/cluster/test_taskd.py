"""Unit tests for ``launcher.cluster.taskd``: enabling TaskD, the rank variables, the manager config, the port.

The stand-in ``taskd`` package lives in ``tests/stubs`` (TaskD is proprietary); tests put it on
``sys.path`` only for themselves and never import it, so ``find_spec("taskd")`` elsewhere is unaffected.
``build_libtaskd`` compiles the stand-in ``libtaskd.so`` (gcc), once per session.
"""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from launcher.cluster import taskd
from launcher.common.errors import LauncherError, UsageError

from tests.helpers.taskd_stub import REPO, STUB_LIB, STUB_PKG, STUBS, build_libtaskd
from tests.helpers.procs import free_port


@pytest.fixture(scope="session")
def stub_libtaskd() -> str:
    return build_libtaskd()


@pytest.fixture
def no_taskd():
    """The real environment has no ``taskd`` (skip on a machine where one is installed)."""
    assert "taskd" not in sys.modules
    if importlib.util.find_spec("taskd") is not None:
        pytest.skip("a 'taskd' package is installed in this environment")


@pytest.fixture
def stub_on_path(monkeypatch):
    """The stand-in package importable (found, never imported) for this test only."""
    assert "taskd" not in sys.modules
    monkeypatch.syspath_prepend(str(STUBS))
    yield STUB_PKG
    sys.modules.pop("taskd", None)


def load_stub_api():
    """The stand-in ``taskd.api`` under a private name (keeps ``taskd`` out of ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location("_taskd_stub_api", STUB_PKG / "api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- taskd_enabled --------------------------------------------------------------------------------
def test_off_is_off_even_when_installed(stub_on_path):
    assert taskd.taskd_enabled("off", {}) is False


def test_auto_without_the_package_is_off(no_taskd):
    assert taskd.taskd_enabled("auto", {}) is False


def test_auto_with_the_package_is_on(stub_on_path):
    assert taskd.taskd_enabled("auto", {}) is True
    assert taskd.taskd_enabled("AUTO", {"TASKD_PROCESS_ENABLE": "on"}) is True


def test_auto_respects_taskd_process_enable_off(stub_on_path):
    assert taskd.taskd_enabled("auto", {"TASKD_PROCESS_ENABLE": "off"}) is False
    assert taskd.taskd_enabled("auto", {"TASKD_PROCESS_ENABLE": "OFF"}) is False


def test_on_with_the_package(stub_on_path):
    assert taskd.taskd_enabled("on", {}) is True
    assert taskd.taskd_enabled("on", {"TASKD_PROCESS_ENABLE": "off"}) is True  # explicit wins


def test_on_without_the_package_says_how_to_install(no_taskd, monkeypatch):
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(UsageError) as info:
        taskd.taskd_enabled("on", {})
    text = "\n".join(info.value.lines())
    assert info.value.exit_code == 2
    assert "not installed" in text
    assert "pip install taskd-<version>-py3-none-linux_aarch64.whl" in text
    assert "MindCluster" in text
    assert "--taskd off" in text


def test_an_unrelated_taskd_package_is_not_taskd(tmp_path, monkeypatch, caplog):
    fake = tmp_path / "taskd"
    fake.mkdir()
    (fake / "__init__.py").write_text("")  # e.g. the unrelated PyPI project
    monkeypatch.syspath_prepend(str(tmp_path))
    assert taskd.taskd_enabled("auto", {}) is False
    assert "not MindCluster's TaskD" in caplog.text
    with pytest.raises(UsageError, match="not MindCluster's TaskD"):
        taskd.taskd_enabled("on", {})


@pytest.mark.parametrize("mode", ["yes", "", "1", "enabled"])
def test_unknown_mode(mode):
    with pytest.raises(UsageError, match="--taskd must be one of auto, on, off"):
        taskd.taskd_enabled(mode, {})


# -- libtaskd_path --------------------------------------------------------------------------------
def test_libtaskd_path_in_the_package(stub_on_path, stub_libtaskd):
    assert taskd.libtaskd_path() == str(STUB_LIB)
    assert taskd.libtaskd_path().endswith("/taskd/python/cython_api/libs/libtaskd.so")


def test_libtaskd_path_missing_names_the_expected_path(tmp_path, monkeypatch):
    shutil.copytree(STUB_PKG, tmp_path / "taskd", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    expected = str(tmp_path / "taskd" / "python" / "cython_api" / "libs" / "libtaskd.so")
    with pytest.raises(UsageError) as info:
        taskd.libtaskd_path()
    assert expected in info.value.message


def test_libtaskd_path_without_the_package(no_taskd):
    with pytest.raises(UsageError, match="not installed"):
        taskd.libtaskd_path()


# -- rank_env -------------------------------------------------------------------------------------
LIB = "/site/taskd/python/cython_api/libs/libtaskd.so"


@pytest.mark.parametrize("existing, expected", [
    (None, LIB),
    ("", LIB),
    ("/opt/libjemalloc.so", f"{LIB}:/opt/libjemalloc.so"),
    ("/a.so:/b.so", f"{LIB}:/a.so:/b.so"),
    ("/a.so /b.so", f"{LIB}:/a.so:/b.so"),  # ld.so also splits on spaces
    (":/a.so:", f"{LIB}:/a.so"),
    (LIB, LIB),  # already there: unchanged, no duplicate
    (f"/a.so:{LIB}", f"/a.so:{LIB}"),
])
def test_ld_preload_is_extended_not_replaced(existing, expected):
    environ = {} if existing is None else {"LD_PRELOAD": existing}
    env = taskd.rank_env(environ, LIB)
    assert env == {"TASKD_PROCESS_ENABLE": "on", "LD_PRELOAD": expected}


def test_ld_preload_same_file_through_a_symlink_is_not_added_twice(tmp_path):
    real = tmp_path / "libtaskd.so"
    real.write_bytes(b"")
    link = tmp_path / "link.so"
    link.symlink_to(real)
    env = taskd.rank_env({"LD_PRELOAD": str(link)}, str(real))
    assert env["LD_PRELOAD"] == str(link)


def test_rank_env_overrides_taskd_process_enable_and_leaves_environ_alone():
    environ = {"TASKD_PROCESS_ENABLE": "off", "LD_PRELOAD": "/a.so"}
    env = taskd.rank_env(environ, LIB)
    assert env["TASKD_PROCESS_ENABLE"] == "on"
    assert environ == {"TASKD_PROCESS_ENABLE": "off", "LD_PRELOAD": "/a.so"}


def test_the_preload_reaches_a_process(stub_libtaskd, tmp_path):
    """The stand-in library's constructor records the pid and TASKD_PROCESS_ENABLE it saw."""
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TASKD_PROCESS_ENABLE")}
    base["TASKD_STUB_DIR"] = str(tmp_path)
    env = {**base, **taskd.rank_env(base, stub_libtaskd)}
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], env=env,
                          capture_output=True, text=True, check=True)
    lines = (tmp_path / "preloaded").read_text().splitlines()
    assert f"{proc.stdout.strip()} on" in lines


# -- manager_config -------------------------------------------------------------------------------
def test_manager_config_is_the_vendor_manager_py_dict():
    config = taskd.manager_config("job-7", 4, 8)
    assert config == {"job_id": "job-7", "node_nums": 4, "proc_per_node": 8}
    assert json.loads(json.dumps(config)) == config


def test_manager_config_is_accepted_by_the_stand_in():
    assert load_stub_api()._config_problem(taskd.manager_config("job-7", 2, 16)) is None


def test_a_dict_cluster_infos_is_rejected_like_taskd_does():
    """TaskD's backend parses cluster_infos as a list; the documented dict fails init."""
    api = load_stub_api()
    config = dict(taskd.manager_config("j", 1, 1))
    config["cluster_infos"] = {"ip": "10.0.0.1", "port": "9601", "name": "n", "role": "r"}
    assert "must be a list" in api._config_problem(config)
    config["cluster_infos"] = [{"ip": "10.0.0.1", "port": "9601", "name": "n", "role": "r"}]
    assert api._config_problem(config) is None


@pytest.mark.parametrize("args", [("", 1, 1), (None, 1, 1), ("j", 0, 1), ("j", 1, -2), ("j", True, 1),
                                  ("j", 1, "8"), ("j", 1.0, 1)])
def test_manager_config_rejects_bad_values(args):
    with pytest.raises(UsageError):
        taskd.manager_config(*args)


# -- check_port_free ------------------------------------------------------------------------------
def test_a_free_port_passes():
    taskd.check_port_free(free_port())


def test_a_busy_port_names_the_port_and_the_holder():
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with pytest.raises(LauncherError) as info:
            taskd.check_port_free(port)
    err = info.value
    assert not isinstance(err, UsageError) and err.exit_code == 1
    assert f"port {port}" in err.message
    text = "\n".join(err.lines())
    assert f"pid {os.getpid()}:" in text or "psutil cannot tell" in text
    assert "--taskd off" in text


def test_a_busy_ipv6_dual_stack_port_is_busy():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.bind(("::", 0))
    except OSError:
        pytest.skip("IPv6 unavailable")
    with listener:
        listener.listen(1)
        with pytest.raises(LauncherError):
            taskd.check_port_free(listener.getsockname()[1])


def test_time_wait_leftovers_do_not_count_as_busy():
    """A previous manager's closed connections (TIME_WAIT) must not fail the next run."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's net.Listen (TaskD) does
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server side closes first: its socket ends in TIME_WAIT
    client.close()
    listener.close()
    assert taskd._try_bind(port, "0.0.0.0", reuse=False) is not None  # the plain bind test alone fails
    taskd.check_port_free(port)


# -- sidecar_argv ---------------------------------------------------------------------------------
def test_sidecar_argv():
    config = taskd.manager_config("job", 2, 8)
    argv = taskd.sidecar_argv(config, "/run/events.jsonl", "run-1")
    assert argv[:3] == [sys.executable, "-m", "launcher.cluster.taskd_sidecar"]
    opts = dict(zip(argv[3::2], argv[4::2]))
    assert json.loads(opts["--config"]) == config
    assert opts["--events"] == "/run/events.jsonl"
    assert opts["--run-id"] == "run-1"
    assert opts["--parent-pid"] == str(os.getpid())
    assert "--pod-ip" not in opts


def test_sidecar_argv_with_pod_ip_and_parent():
    argv = taskd.sidecar_argv({"job_id": "j"}, "/e", "r", pod_ip="10.0.0.5", parent_pid=42)
    opts = dict(zip(argv[3::2], argv[4::2]))
    assert opts["--pod-ip"] == "10.0.0.5"
    assert opts["--parent-pid"] == "42"


def test_sidecar_argv_parses():
    from launcher.cluster.taskd_sidecar import _parse

    argv = taskd.sidecar_argv(taskd.manager_config("j", 1, 1), "/e", "r", pod_ip="10.1.1.1")
    args = _parse(argv[3:])
    assert json.loads(args.config) == {"job_id": "j", "node_nums": 1, "proc_per_node": 1}
    assert (args.events, args.run_id, args.parent_pid, args.pod_ip) == ("/e", "r", os.getpid(), "10.1.1.1")


def test_no_heavy_imports():
    code = ("import sys, launcher.cluster.taskd; bad = {'psutil', 'tenacity', 'taskd'} & set(sys.modules); "
            "print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(REPO))
    assert out.stdout.strip() == "[]"


# -- TaskdManager.starts_processes: the session keeps the sidecar out of the first attempt's cgroup --
def host(mode: str, hosts_rank0: bool):
    from types import SimpleNamespace

    return SimpleNamespace(spec=SimpleNamespace(cluster=SimpleNamespace(taskd=mode)),
                           ctx=SimpleNamespace(base_env={}, topology=SimpleNamespace(hosts_rank0=hosts_rank0)))


def test_the_sidecar_starts_only_with_taskd_on_the_server_of_rank_0(stub_on_path, stub_libtaskd, monkeypatch):
    monkeypatch.setattr(taskd, "libtaskd_path", lambda: stub_libtaskd)
    manager = taskd.TaskdManager()
    assert manager.starts_processes(host("on", True)) is True
    assert manager.starts_processes(host("on", False)) is False
    assert manager.starts_processes(host("off", True)) is False


def test_no_sidecar_without_the_package(no_taskd):
    assert taskd.TaskdManager().starts_processes(host("auto", True)) is False
