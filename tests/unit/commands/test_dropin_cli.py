"""torchrun's and msrun's options as ``launcher run`` maps them (issue: drop-in command lines):
free ports, console routing, roles, signals, msrun's sizes and variables, errors in the user's spelling."""

import json

import pytest
from hypothesis import given, strategies as st

from launcher.commands.cli import main
from tests.helpers.cli import run_cli


@pytest.fixture(autouse=True)
def _isolated(clean_env, restore_launcher_logger, monkeypatch, tmp_path):
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(tmp_path / "run"))


def dry_json(capsys, *args):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--json", *args, "--", "true")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def parsed(monkeypatch):
    """``launcher run ARGS -- true`` -> the RunOptions ``execute`` would get."""
    import launcher.run.runner

    seen = []
    monkeypatch.setattr(launcher.run.runner, "execute", lambda opts: seen.append(opts) or 0)

    def parse(*args):
        assert main(["run", *args, "--", "true"]) == 0
        return seen.pop()
    return parse


def errors(err):
    return [line for line in err.splitlines() if not line.startswith("[launcher")]


# --------------------------------------------------------------------------- torchrun

def test_rdzv_endpoint_port_0_is_a_free_port(capsys):
    doc = dry_json(capsys, "--rdzv_endpoint=localhost:0", "--nproc_per_node=2")
    assert doc["master_addr"] == "localhost" and doc["master_port"] not in (0, 29400, 29500)
    assert {r["env"]["MASTER_PORT"] for r in doc["ranks"]} == {str(doc["master_port"])}
    code, _, err = run_cli(capsys, "run", "--dry-run", "--rdzv-endpoint", "h:0", "--nnodes", "2", "--node-rank", "0",
                           "--nproc-per-node", "1", "--", "true")
    assert code == 2 and "port 0 (a free port) works on one node only" in err


@pytest.mark.parametrize("args, shown", [
    (["-r", "3"], ()),
    (["--redirects", "0:3"], (1,)),  # local rank 0 only to its file
    (["--redirects", "2"], (0, 1)),  # stderr only: stdout, and the rank, stay on the console
    (["-r", "3", "-t", "0:1"], (0,)),  # tee brings local rank 0's stdout back
    (["--local-ranks-filter", "1"], (1,)),
    (["--local_ranks_filter=0,1", "-r", "1:3"], (0,)),
    (["--node-rank", "1", "--nnodes", "2", "--master-addr", "h", "--local-ranks-filter", "0"], (2,)),
])
def test_redirects_tee_and_filter_choose_the_console_ranks(parsed, args, shown):
    assert parsed("--nproc-per-node", "2", *args).console_ranks == shown


def test_tee_alone_changes_nothing_and_says_so(capsys, parsed):
    assert parsed("--nproc-per-node", "2", "--tee", "3").console_ranks is None  # all
    assert "--tee: every rank's output is in its log file" in capsys.readouterr()[1]


@pytest.mark.parametrize("args, line", [
    (["--tee", "4"], "--tee '4': expected 0-3"),
    (["-r", "0:x"], "--redirects '0:x': expected 0-3"),
    (["--local-ranks-filter", "a"], "--local-ranks-filter 'a': expected local ranks"),
    (["-r", "3", "--console-ranks", "0"], "both choose the console's ranks"),
    (["--signals-to-handle", "SIGTERM,SIGUSR1"], "forwards no other signal (SIGUSR1)"),
    (["--numa-binding", "node", "--bind-cores", "0;1"], "--numa-binding node and --bind-cores 0;1 differ"),
])
def test_torchrun_values_the_launcher_cannot_honour_exit_2(capsys, args, line):
    code, out, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "2", *args, "--", "true")
    assert code == 2 and out == ""
    assert any(line in e for e in errors(err)), err


def test_role_and_signals_reach_the_ranks(capsys):
    doc = dry_json(capsys, "--nproc-per-node", "1", "--role", "trainer", "--signals_to_handle", "SIGTERM,SIGINT")
    env = doc["ranks"][0]["env"]
    assert env["ROLE_NAME"] == "trainer"
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP"
    assert dry_json(capsys, "--nproc-per-node", "1")["ranks"][0]["env"]["ROLE_NAME"] == "default"


def test_accepted_torchrun_options_say_one_line_each(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--monitor_interval", "1",
                           "--start-method", "fork", "--rdzv-conf", "join_timeout=5", "--event-log-handler", "x",
                           "--", "true")
    assert code == 0
    lines = [line for line in err.splitlines() if "is torchrun's" in line]
    assert sorted(line.split("] ", 1)[1].split(" ")[1] for line in lines) == [
        "--event-log-handler", "--monitor-interval", "--rdzv-conf", "--start-method"]


def test_etcd_rendezvous_is_the_coordinator_with_its_conf(parsed, capsys):
    """torchrun's ``--rdzv-backend etcd[-v2] --rdzv-endpoint H:P --rdzv-conf protocol=https,cacert=,...`` (both
    backends' spellings) is ``--coordinator etcds://H:P`` with the TLS files, and its timeouts."""
    opts = parsed("--nproc-per-node", "1", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "10.0.0.9:2379",
                  "--rdzv-id", "j", "--rdzv-conf", "protocol=https,ca_cert=/c,ssl_cert=/a,ssl_cert_key=/k,"
                                                   "last_call_timeout=7")
    assert (opts.coordinator, opts.coordinator_cacert, opts.coordinator_cert, opts.coordinator_key,
            opts.elastic_wait, opts.run_id) == ("etcds://10.0.0.9:2379", "/c", "/a", "/k", 7.0, "j")
    opts = parsed("--nproc-per-node", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint", "h:1", "--rdzv-id", "j",
                  "--rdzv-conf", "timeout=60")
    assert (opts.coordinator, opts.sync_timeout) == ("etcd://h:1", 60.0)
    for conf, line in (("etcd_prefix=/x", "--rdzv-conf 'etcd_prefix=/x': not one of"),
                       ("timeout=soon", "--rdzv-conf timeout=soon: expected seconds")):
        code, _, err = run_cli(capsys, "run", "--dry-run", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                               "--rdzv-endpoint", "h:1", "--rdzv-conf", conf, "--", "true")
        assert code == 2 and line in err


def test_run_path_runs_the_script_with_python(capsys, tmp_path, monkeypatch):
    import sys

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    code, out, _ = run_cli(capsys, "run", "--dry-run", "--json", "--nproc-per-node", "1", "--no-python",
                           "--run-path", "train.py")
    assert code == 0 and json.loads(out)["ranks"][0]["argv"] == [sys.executable, "-u", "train.py"]


# --------------------------------------------------------------------------- msrun

def test_msrun_sizes_are_ranks_and_machines_and_imply_mindspore(capsys):
    doc = dry_json(capsys, "--worker_num=4", "--local_worker_num=2", "--master_addr=10.0.0.1", "--node_rank=1",
                   "--join=True")
    assert doc["framework"] == "mindspore" and doc["world_size"] == 4
    assert [r["rank"] for r in doc["ranks"]] == [2, 3]  # no scheduler: it runs next to rank 0
    assert (doc["master_addr"], doc["master_port"]) == ("10.0.0.1", 8118)  # msrun's port across machines
    assert {r["env"]["MS_SCHED_HOST"] for r in doc["ranks"]} == {"10.0.0.1"}


def test_msrun_one_machine_starts_the_scheduler_here(capsys):
    doc = dry_json(capsys, "--worker_num", "2", "--local_worker_num", "2")
    assert [r["role"] for r in doc["ranks"]] == ["scheduler", "worker", "worker"]
    assert {r["env"]["MS_WORKER_NUM"] for r in doc["ranks"]} == {"2"}


def test_msrun_variables_reach_every_process(capsys, tmp_path):
    table = tmp_path / "hccl.json"
    table.write_text("{}")
    doc = dry_json(capsys, "--worker_num", "1", "--local_worker_num", "1", "--cluster_time_out", "30",
                   "--rank_table_file", str(table))
    for rank in doc["ranks"]:
        assert (rank["env"]["MS_TOPO_TIMEOUT"], rank["env"]["RANK_TABLE_FILE"]) == ("30", str(table))
    assert dry_json(capsys, "--worker_num", "1")["ranks"][1]["env"]["MS_TOPO_TIMEOUT"] == "600"  # msrun's default


def test_msrun_tail_and_join(capsys, parsed):
    opts = parsed("--worker_num", "2", "--local_worker_num", "2", "--tail_worker_log", "1", "--join", "False")
    assert (opts.console_ranks, opts.framework) == ((1,), "mindspore")
    assert "--join False: the launcher always waits for its ranks" in capsys.readouterr()[1]
    assert parsed("--worker_num", "2", "--tail_worker_log", "-1").console_ranks is None


@pytest.mark.parametrize("args, line", [
    (["--worker_num", "4", "--local_worker_num", "2"], "pass --node_rank on each machine"),
    (["--local_worker_num", "2"], "--worker_num 8 (msrun's default) over 4 machines"),
    (["--worker_num", "3", "--local_worker_num", "2"], "is not a multiple of --local_worker_num 2"),
    (["--worker_num", "2", "--framework", "pytorch"], "msrun's options start a MindSpore job: drop --framework"),
    (["--local_worker_num", "2", "--nproc-per-node", "1"], "--local_worker_num 2 and --nproc-per-node 1 differ"),
    (["--worker_num", "4", "--nproc-per-node", "2", "--nnodes", "1"], "--worker_num 4 and --nnodes 1 x 2 ranks"),
    (["--worker_num", "2", "--bind_numa", '{"device0": ["0-3"]}'], "msrun's per-device binding table is not read"),
    (["--worker_num", "2", "--bind_core", "True", "--bind-cores", "0-3"], "--bind_core True and --bind-cores 0-3"),
    (["--worker_num", "2", "--sim_level", "1"], "--sim_level is msrun's: a MindSpore dry run"),
])
def test_msrun_lines_the_launcher_cannot_honour_exit_2(capsys, args, line):
    code, out, err = run_cli(capsys, "run", "--dry-run", *args, "--", "true")
    assert code == 2 and out == ""
    assert any(line in e for e in errors(err)), err


@pytest.mark.parametrize("args", [["--nproc-per-node", "2", "--numa-binding", "node"],
                                  ["--worker_num", "2", "--bind_core", "True"],
                                  ["--worker_num", "2", "--bind_numa", "True"]])
def test_torchrun_and_msrun_binding_is_bind_cores_auto(parsed, args):
    assert parsed(*args).bind_cores == "auto"


def test_msrun_binding_off_is_fine(capsys):
    assert dry_json(capsys, "--worker_num", "1", "--bind_core", "False", "--bind_numa=false")["world_size"] == 1


@pytest.mark.parametrize("args, shown, hidden", [
    (["--worker_num=x"], "'--worker_num'", "--worker-num"),
    (["--worker_nmu", "2"], "No such option '--worker_nmu'", "--worker-nmu"),
    (["--nproc_per_node", "x"], "'--nproc_per_node'", "--nproc-per-node"),
])
def test_errors_show_the_option_as_typed(capsys, args, shown, hidden):
    code, _, err = run_cli(capsys, "run", "--dry-run", *args, "--", "true")
    assert code == 2 and shown in err and hidden not in err.split("Did you mean")[0], err


def test_a_missing_value_is_named_as_typed(capsys):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--master_port")
    assert code == 2 and "'--master_port' requires an argument" in err and "--master-port" not in err


def test_msrun_sizes_agree_with_the_launchers_own(capsys):
    doc = dry_json(capsys, "--worker_num", "2", "--nproc-per-node", "2")
    assert doc["world_size"] == 2 and doc["framework"] == "mindspore"


def test_did_you_mean_in_msrun_spelling(capsys):
    _, _, err = run_cli(capsys, "run", "--dry-run", "--worker_nu", "2", "--", "true")
    assert "'--worker_num'" in err.split("Did you mean")[1]


# --------------------------------------------------------------------------- MindSpore without its variables

def test_a_mindspore_init_without_cluster_variables_says_what_to_add():
    from launcher.run.report import framework_hint

    message = ("RuntimeError: Maybe you are trying to call 'mindspore.communication.init()' without using "
               "'mpirun', which will make MindSpore load several environment variables")
    assert framework_hint(["x", message]) == [
        "the rank called MindSpore's init() without a MindSpore cluster's variables: add --framework mindspore "
        "(msrun's options, e.g. --worker_num, imply it)"]
    assert framework_hint(["RuntimeError: other"]) == []


# --------------------------------------------------------------------------- parsers, any input

@given(text=st.text(alphabet="0123456789:,- x", max_size=12))
def test_std_values_parse_or_say_one_line(text):
    """torchrun's Std value: 0-3 for every rank, or LOCAL_RANK:STD pairs; anything else one UsageError."""
    from launcher.commands.torchrun import parse_std
    from launcher.common.errors import UsageError

    try:
        value = parse_std(text, "--tee")
    except UsageError as exc:
        assert exc.args[0].startswith("--tee ")
        return
    assert value in range(4) if isinstance(value, int) else all(
        rank >= 0 and std in range(4) for rank, std in value.items())


@given(nproc=st.integers(1, 6), node=st.integers(0, 3), redirects=st.sampled_from([None, "0", "1", "2", "3", "0:3,2:1"]),
       tee=st.sampled_from([None, "0", "1", "3", "1:1"]), wanted=st.sampled_from([None, "0", "1,2", "5"]))
def test_console_mapping_shows_only_this_nodes_ranks(nproc, node, redirects, tee, wanted):
    """Whatever -r / -t / --local-ranks-filter say, the console shows a subset of this node's ranks, and a
    rank torchrun would print (not filtered out, stdout not redirected or teed) stays."""
    from launcher.commands.torchrun import _console

    given_ = {k: v for k, v in (("torchrun_redirects", redirects), ("torchrun_tee", tee),
                                ("torchrun_local_ranks_filter", wanted)) if v is not None}
    kwargs = {"nproc_per_node": nproc, "node_rank": node, "console_ranks": None}
    assert _console(kwargs, [], given_) == []
    first = node * nproc
    shown = kwargs["console_ranks"]
    if redirects is None and wanted is None:
        assert shown is None
        return
    assert set(shown) <= set(range(first, first + nproc))
    if redirects is None and tee is None:
        assert set(shown) == {first + int(r) for r in wanted.split(",") if int(r) < nproc}


def test_mindspore_scheduler_gets_an_ip_address_as_msrun_gives_it(capsys):
    """msrun resolves --master_addr; MindSpore's workers cannot reach a scheduler named by host name."""
    doc = dry_json(capsys, "--worker_num", "1", "--master_addr", "localhost")
    assert {r["env"]["MS_SCHED_HOST"] for r in doc["ranks"]} == {"127.0.0.1"}
    assert dry_json(capsys, "--nproc-per-node", "1", "--master-addr", "localhost")["master_addr"] == "localhost"
    code, _, err = run_cli(capsys, "run", "--dry-run", "--worker_num", "1", "--master_addr", "no-such-host.invalid",
                           "--", "true")
    assert code == 2 and "MindSpore's scheduler needs an IP address" in err
