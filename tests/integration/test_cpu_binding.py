"""``--bind-cores`` with real processes: each rank sees its CPU set in ``os.sched_getaffinity``, whether
it started cold or from a warm standby (``--preload``), and ``none`` leaves the launcher's own set.

tests/workers/start_probe.py dumps each rank's affinity (attempt 0 cold, attempt 1 after rank 1 fails:
from the standbys with ``--preload``). The planner itself is tested in tests/unit/jobspec/test_binding.py.
"""

import os

import pytest

from launcher.jobspec.binding import plan_auto
from tests.helpers.procs import free_port, wait_until
from tests.integration.test_standby import Job

ALLOWED = frozenset(os.sched_getaffinity(0))

pytestmark = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs to give 2 ranks different sets")


def _affinities(job: Job, attempt: int) -> list:
    return [frozenset(job.dump(attempt, rank)["affinity"]) for rank in (0, 1)]


@pytest.mark.parametrize("preload", [None, "json"], ids=["cold", "standby"])
def test_auto_gives_each_rank_its_own_cpus(tmp_path, preload):
    job = Job(tmp_path / "job", preload, free_port(), "--fail-rank", "1", "--mode", "ok", "--fail-attempt", "1",
              options=["--bind-cores", "auto"])
    # Both ranks of attempt 0 wrote their sets before rank 1 is made to fail (else rank 0 may be
    # stopped before it wrote its own).
    assert wait_until(lambda: all((job.out / f"0-{rank}.json").exists() for rank in (0, 1))
                      or job.proc.poll() is not None, 60)
    job.go_when_ready(2 if preload else 0)
    assert job.finish() == 0  # rank 1 failed on attempt 0 only
    # This machine's sysfs has no davinci devices: NUMA spread or even split of the allowed CPUs.
    binding = job.events("cpu_binding")
    assert len(binding) == 1 and binding[0]["how"] in ("numa", "even")
    for attempt in (0, 1):
        sets = _affinities(job, attempt)
        assert not sets[0] & sets[1] and sets[0] | sets[1] == ALLOWED, (attempt, sets)
        if binding[0]["how"] == "even":
            assert sets == list(plan_auto(ALLOWED, [None, None], {}).sets)
    if preload:
        assert [e["ranks"] for e in job.events("standby_start")] == [[0, 1]]  # attempt 1 was warm


def test_a_list_and_none(tmp_path):
    first, second = sorted(ALLOWED)[:2]
    listed = Job(tmp_path / "list", None, free_port(), "--fail-rank", "1", "--mode", "ok",
                 options=["--bind-cores", f"{first};{second}"])
    listed.trigger.touch()
    assert listed.finish() == 0
    assert _affinities(listed, 0) == [{first}, {second}]
    unbound = Job(tmp_path / "none", None, free_port(), "--fail-rank", "1", "--mode", "ok")
    unbound.trigger.touch()
    assert unbound.finish() == 0
    assert _affinities(unbound, 0) == [ALLOWED, ALLOWED]


def test_a_standby_with_a_blas_pool_leaves_a_bound_rank_to_start_cold(tmp_path):
    """numpy's OpenBLAS sizes its pool from the CPU set when it loads: in a standby, before
    ``--bind-cores`` binds it. A cold rank's pool fits its own set, so that rank starts cold."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    pytest.importorskip("numpy")
    job = Job(tmp_path / "job", "numpy", free_port(), "--fail-rank", "1", "--mode", "ok", "--fail-attempt", "1",
              env=env, options=["--bind-cores", "auto"])
    assert wait_until(lambda: all((job.out / f"0-{rank}.json").exists() for rank in (0, 1))
                      or job.proc.poll() is not None, 60)
    job.go_when_ready(2)
    assert job.finish() == 0
    [started] = job.events("standby_start")
    assert started["ranks"] == [] and sorted(started["cold"]) == ["0", "1"]
    assert all("BLAS thread pool was sized before --bind-cores" in why for why in started["cold"].values())
    sets = _affinities(job, 1)
    assert not sets[0] & sets[1] and sets[0] | sets[1] == ALLOWED
