"""Each recovery strategy with real processes: retry, exit, dump, recover, recover-in-place."""




def kinds(events, name):
    return [e for e in events if e["event"] == name]


def test_retry_restarts_the_group(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1", "--recover-strategy", "retry"],
                        ["--fail-rank", "0", "--run", "0.2"])
    assert code == 0
    assert [e["scope"] for e in kinds(launcher.events(), "restart")] == ["group"]


def test_exit_stops_everything_and_exits_nonzero_at_once(launcher):
    code = launcher.run(["--nproc-per-node", "3", "--max-restarts", "5", "--recover-strategy", "exit"],
                        ["--fail-rank", "2", "--exit-code", "6"])
    assert code == 6
    events = launcher.events()
    assert not kinds(events, "restart") and kinds(events, "exit_for_reschedule")
    assert len(kinds(events, "attempt_start")) == 1


def test_dump_makes_the_healthy_ranks_save_before_the_restart(launcher, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    code = launcher.run(["--nproc-per-node", "3", "--max-restarts", "1", "--recover-strategy", "retry,dump"],
                        ["--fail-rank", "1", "--term-delay", "0.2", "--ckpt-dir", str(ckpt), "--run", "0.5"])
    assert code == 0
    assert sorted(p.name for p in ckpt.iterdir()) == ["rank_0.ckpt", "rank_2.ckpt"]  # the healthy ones
    gasp = kinds(launcher.events(), "gasp")
    assert gasp and gasp[0]["source"] == "rank 1 failed" and gasp[0]["save"] is True


def test_recover_dumps_then_exits_for_rescheduling(launcher, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "3", "--recover-strategy", "recover"],
                        ["--fail-rank", "0", "--exit-code", "9", "--term-delay", "0.1", "--ckpt-dir", str(ckpt)])
    assert code == 9
    assert [p.name for p in ckpt.iterdir()] == ["rank_1.ckpt"]
    assert kinds(launcher.events(), "exit_for_reschedule")


def test_recover_in_place_restarts_only_the_failed_rank(launcher, monkeypatch):
    monkeypatch.setenv("MS_ENABLE_TFT", "{ARF:1}")
    code = launcher.run(["--framework", "mindspore", "--nproc-per-node", "3", "--max-restarts", "1",
                         "--recover-strategy", "recover-in-place"], ["--fail-rank", "1", "--run", "1.0"])
    assert code == 0, launcher.stderr
    events = launcher.events()
    assert [(e["scope"], e["after_rank"]) for e in kinds(events, "restart")] == [("rank", 1)]
    assert not kinds(events, "stop_group")  # ranks 0 and 2 were never stopped
    ready = launcher.ready_lines()
    pids = {}
    for rank, attempt, pid, *_ in ready:
        pids.setdefault(int(rank), set()).add(pid)
    assert len(pids[1]) == 2 and len(pids[0]) == 1 and len(pids[2]) == 1
    assert (launcher.log_dir / "latest" / "attempt_1" / "rank_1.log").exists()


def test_unsupported_in_place_falls_back_to_group_restart(launcher):
    code = launcher.run(["--nproc-per-node", "2", "--max-restarts", "1", "--recover-strategy", "recover-in-place"],
                        ["--fail-rank", "1", "--run", "0.3"])
    assert code == 0
    assert [e["scope"] for e in kinds(launcher.events(), "restart")] == ["group"]
    assert "cannot re-join a running group" in launcher.stderr
