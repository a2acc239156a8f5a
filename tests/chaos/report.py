"""The chaos suite's end-of-session summary, as a plugin the top ``tests/conftest.py`` registers.

It lives here rather than in ``tests/chaos/conftest.py`` because under pytest-xdist (``make test``
runs ``-n 2``) the controller, which prints the terminal summary, never loads a sub-directory's
conftest: the tests run in the workers. Each chaos test's ``RunRecord``s travel to the controller on
its teardown report (``user_properties``, set by ``tests/chaos/conftest.py``), and both a plain and a
distributed run collect them from there, in ``pytest_runtest_logreport``.
"""

import dataclasses
import datetime
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional

import pytest

from tests.chaos.harness import median

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "chaos.md"
#: The key of the teardown report's ``user_properties`` entry that carries a test's records.
RECORDS_KEY = "chaos_records"

RESULTS: List["RunRecord"] = []
_STATE = {"selected": set(), "finished": set(), "first_start": None, "last_end": None}


@dataclass
class RunRecord:
    """What one chaos run did and measured."""

    framework: str
    kind: str
    run: int
    fault: str = ""                          # e.g. "rank 2 SIGKILL at step 70"
    fault_step: Optional[int] = None         # step injected at / triggered at
    progress: Optional[int] = None           # highest step completed before the fault
    resumed_at: Optional[int] = None         # step every rank resumed from
    steps_lost: Optional[int] = None         # progress - resumed_at
    respawn_s: Optional[float] = None        # fault -> first rank of the next attempt spawned
    recover_s: Optional[float] = None        # fault -> every rank of the next attempt back in its group
    exit_codes: List[int] = field(default_factory=list)  # of each launch, in order
    recovered: bool = False                  # the job ended with exit 0 and the reference hash
    outcome: str = "?"                       # pytest's verdict on all the assertions
    wall_s: float = 0.0
    note: str = ""



def is_chaos(nodeid: str) -> bool:
    """Whether a test id is one of the chaos suite's (every module there carries the marker)."""
    return nodeid.split("::", 1)[0].startswith("tests/chaos/")


def pytest_collection_finish(session):
    _STATE["selected"] = {item.nodeid for item in session.items if is_chaos(item.nodeid)}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under xdist the controller collects nothing itself: every worker reports the same ids."""
    _STATE["selected"] = {nodeid for nodeid in ids if is_chaos(nodeid)}


def pytest_runtest_logstart(nodeid, location):
    if is_chaos(nodeid) and _STATE["first_start"] is None:
        _STATE["first_start"] = time.time()  # before the session fixtures (reference runs) of the first


def pytest_runtest_logreport(report):
    if not is_chaos(report.nodeid) or report.when != "teardown":
        return
    _STATE["finished"].add(report.nodeid)
    _STATE["last_end"] = time.time()
    for key, records in report.user_properties:
        if key == RECORDS_KEY:
            RESULTS.extend(RunRecord(**fields) for fields in records)


def as_property(records: Iterable["RunRecord"]) -> tuple:
    """The ``user_properties`` entry carrying records (plain dicts: xdist serializes reports)."""
    return (RECORDS_KEY, [dataclasses.asdict(record) for record in records])


def _fmt(value, digits=1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def summary_rows():
    """One row per (framework, kind), in the order the runs happened."""
    groups = {}
    for r in RESULTS:
        groups.setdefault((r.framework, r.kind), []).append(r)
    rows = []
    for (framework, kind), runs in groups.items():
        lost = [r.steps_lost for r in runs if r.steps_lost is not None]
        rows.append([framework, kind, str(len(runs)), f"{sum(r.recovered for r in runs)}/{len(runs)}",
                     _fmt(max(lost) if lost else None),
                     _fmt(median([r.respawn_s for r in runs]), 2), _fmt(median([r.recover_s for r in runs]), 2),
                     ", ".join(sorted({r.outcome for r in runs}))])
    return rows


SUMMARY_HEADER = ["framework", "fault kind", "runs", "recovered", "steps lost (max)",
                  "to respawn, median (s)", "to recover, median (s)", "test"]
DETAIL_HEADER = ["framework", "fault kind", "run", "fault", "progress", "resumed at", "lost",
                 "launcher exits", "respawn (s)", "recover (s)", "wall (s)", "test", "note"]


def detail_rows():
    return [[r.framework, r.kind, str(r.run), r.fault or "-", _fmt(r.progress), _fmt(r.resumed_at),
             _fmt(r.steps_lost), " then ".join(map(str, r.exit_codes)) or "-", _fmt(r.respawn_s, 2),
             _fmt(r.recover_s, 2), _fmt(r.wall_s), r.outcome, r.note.replace("|", "\\|")]
            for r in RESULTS]


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _write_doc(wall: float) -> None:
    from importlib import metadata

    versions = []
    for dist in ("torch", "mindspore"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    try:
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    parts = [DOC_INTRO.strip(), "",
             f"Last run: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, command "
             f"`CHAOS_WRITE_DOC=1 python -m pytest tests/chaos -q` (the suite is also part of `make test`), "
             f"chaos tests' wall time "
             f"{wall:.0f} s, on {os.cpu_count()} CPU cores (load average at the end {load}), "
             f"Python {platform.python_version()}, {', '.join(versions)}.", "",
             "## Summary", "", markdown_table(SUMMARY_HEADER, summary_rows()), "",
             "## Every run", "", markdown_table(DETAIL_HEADER, detail_rows()), "",
             DOC_OUTRO.strip(), ""]
    DOC.write_text("\n".join(parts))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("chaos summary")
    for line in markdown_table(SUMMARY_HEADER, summary_rows()).splitlines():
        tr.write_line(line)
    wall = (_STATE["last_end"] or 0) - (_STATE["first_start"] or 0)
    tr.write_line(f"chaos tests' wall time: {wall:.0f} s")
    complete = _STATE["selected"] and _STATE["selected"] <= _STATE["finished"]
    full = complete and not config.getoption("keyword") and not config.getoption("markexpr") \
        and os.environ.get("CHAOS_WRITE_DOC") == "1"
    if full:
        try:
            _write_doc(wall)
            tr.write_line(f"written to {DOC.relative_to(REPO)}")
        except OSError as exc:
            tr.write_line(f"could not write {DOC}: {exc}")
    else:
        tr.write_line("(partial or filtered run: docs/chaos.md left as it was)")


DOC_INTRO = """
# Chaos suite

`tests/chaos/` runs the real examples under `launcher run` the way the README's Quick start does
(`--nproc-per-node 4 --checkpoint-dir <ckpt> --dp 4 --max-restarts 3`, so the launcher plans every
resume), injects faults at steps drawn from a fixed seed (`random.Random(6)`, issue 6: the same
steps on every run), and checks, for every run:

- the final parameters are bit-identical to a fault-free reference run (its `final sha256`; the
  DCP runs: see below);
- steps recomputed (the highest step completed before the fault minus the step every rank resumed
  from, which must be the `restore_plan` event's step) are at most the checkpoint interval (20), and
  exactly 0 after a dying gasp and after a rank fault (the survivors save a breakpoint);
- no process survives: every launcher and rank pid recorded in `events.jsonl`/`state.json` is gone,
  and the autouse fixture of `tests/conftest.py` finds no descendant left;
- the launcher's exit code matches what happened: 0 after a recovery, 143 after `launcher prestop`,
  -9 (SIGKILL) for a killed launcher;
- `events.jsonl` accounts for every fault: the faulty rank's `rank_exited` with its signal or exit
  code, the survivors' `rank_exited` with 143 (breakpoint saved), `gasp`/`gasp_done` for prestop,
  and one `restore_plan` before every `attempt_start` of every launch.

Fault kinds (PyTorch, `examples/pytorch/train.py --steps 200 --ckpt-every 20 --log-every 1`):

| kind | what happens |
|---|---|
| rank-sigkill, rank-exit-1, rank-sigsegv | `--fail-at-step S --fail-rank R --fail-mode kill/exit/segv`; the launcher restarts the group |
| prestop-gasp | `launcher prestop` once every rank passed step S; then a fresh `launcher run` on the same directories |
| launcher-sigkill | SIGKILL to the launcher once every rank passed step S (its ranks die with it: no breakpoint); a fresh `launcher run` |
| truncated-breakpoint | the prestop-gasp stop, then the breakpoint file the restore plan would pick (rank 0's) is cut to half its size; a fresh `launcher run` |
| truncated-periodic | the launcher-sigkill stop, then the periodic file the plan would give rank 0 (its own) is cut in half; a fresh `launcher run` |
| bitflip-breakpoint | the prestop-gasp stop, then one bit of a weight in the planned breakpoint file is flipped (same size, valid zip); a fresh `launcher run` |
| ms-worker-sigkill | MindSpore (`examples/mindspore/train.py`, `--framework mindspore --dp 2 --stop-timeout 3`, scheduler + 2 CPU workers, 20 steps, `--save-steps 5`): `--fail-mode kill` on worker R after step S |
| ms-prestop-gasp | MindSpore: `launcher prestop` once both workers passed step S; a fresh `launcher run` |
| dcp-rank-sigkill | DCP (`examples/pytorch/dcp_train.py --steps 40 --save-every 5`, FSDP2 over gloo, 4 ranks, `--max-restarts 3`): the test SIGKILLs rank R once rank 0 logged step S; the launcher restarts the 4 ranks |
| dcp-launcher-sigkill-shrink-4to2 | DCP: SIGKILL to the 4-rank launcher once rank 0 logged step S; a fresh `launcher run --nproc-per-node 2` (to the resumed step + 15) resumes the newest complete step: 4 -> 2 |
| dcp-rank-sigkill-at-2 | DCP, in that 2-rank run: rank R SIGKILLed 6-8 steps past the resumed step (after the 2 ranks' own first save); the group restarts on 2 ranks |
| dcp-grow-2to3 | DCP: the 2-rank run ends with its save; a fresh `launcher run --nproc-per-node 3` resumes it (2 -> 3) and trains to step 40 (a planned restart, no fault) |
| dcp-incomplete-step | DCP: the launcher-sigkill stop, then the newest step's `.metadata` is removed (a save cut short, a partial copy); a fresh 4-rank `launcher run` |

The stops are run once each (module fixtures) and kept as a snapshot; every test that starts the
job again does so on its own copy of the run dir and checkpoint dir. The launcher-sigkill step is
moved to 5-12 steps past a multiple of 20, so the SIGKILL lands between two periodic saves.

The DCP runs (`tests/chaos/test_dcp_chaos.py`, seed `random.Random(16)`, issue 16) exercise resume
across world sizes. The example saves no breakpoint, so every resume is from the newest complete DCP
step (`<ckpt>/dcp/step-<n>/` with a `.metadata`): at most `--save-every` (5) steps are recomputed, 10
when the newest step is incomplete. It has no `--fail-at-step` either: the test SIGKILLs the rank's
pid (from `rank_spawned`) once rank 0 logged step S, so the fault lands at S or a step later (the
*progress* column). Checks, per resumed attempt:

- the `restore_plan` event names the step, `saved_world_size` (4 for the steps the 4-rank launch
  wrote, 2 for the 2-rank one's) and the `conversion`: null at the same world size, else `dcp` with
  the step directory as source, both world sizes and the layout it was written with;
- every rank logs `resumed from <that directory> at step S (saved by N ranks)`;
- the full parameters rank 0 loaded (`--dump-loaded`) equal, tensor for tensor, the step resharded
  offline by `dcp_to_torch_save` (a world of one, no launcher; `tests/helpers/dcp.py`, shared with
  `tests/integration/test_dcp_reshard.py`);
- at the same world size as the fault-free 4-rank reference (dcp-rank-sigkill, dcp-incomplete-step)
  every loss after the resume and the final DCP step (model and AdamW state) are bit-identical to
  it; after a world-size change every loss of the 2- and 3-rank runs is within 1e-5 relative of the
  reference's at the same step. Bit-identity is not expected there: the global batch is split evenly
  over any world, but the float32 reductions of the loss and gradients sum in another order (the
  integration test measured 2e-7 relative over 20 steps; a resume from a wrong step or wrong shards
  moves the loss by 1e-2 or more). Steps recomputed after the 2-rank fault (same world) are
  bit-identical to their first computation;
- the newest step without `.metadata` is skipped for the previous complete one, with a warning
  naming it in the `restore_plan` event;
- events: the SIGKILLed rank's `rank_exited` (`failed`, SIGKILL, -9), a `rank_exited` for every
  rank of the attempt and one `restart` after that rank; exit codes -9 then 0 around a launcher
  SIGKILL. For dcp-grow-2to3 the times are from the 2-rank launcher's exit.

For MindSpore the bound after a worker fault is `--save-steps` (5), not 0: a worker blocked in a CPU
collective does not react to SIGTERM, so the launcher SIGKILLs it at `--stop-timeout` with nothing
saved (examples/mindspore/README.md, limit 6) and the job resumes from the newest periodic file.

Times: *to respawn* is from the fault (the faulty rank's `rank_exited` `exited_at`, the `gasp` event,
or the moment the test SIGKILLed the launcher) to the first `rank_spawned` of the next attempt; *to
recover* is to the moment the last rank of that attempt printed `resumed from ...` (the rank logs
carry no timestamps, so a watcher thread polls them every 50 ms). For the kinds that need a second
launcher, the time between the first launcher's exit and the second one's start (an operator's or
the kubelet's choice) is left out. The machine is small
and shared, so most of a recovery is four Python processes importing torch on 2 cores (MindSpore:
the scheduler and the workers importing MindSpore and forming the cluster, plus the 3 s
`--stop-timeout` after which the blocked peer of a dead worker is SIGKILLed).
"""

DOC_OUTRO = """
## Findings, and what was done

1. **truncated-periodic** (fixed): the planner handed rank 0 its own truncated file, because when
   replicas' periodic files differed in size every rank got its own. The planner now applies a
   **majority-size rule** within a replica group: a file whose size differs from a strict majority
   of its replicas is not provably complete, is ignored with a warning, and its rank borrows a
   majority replica's file. Without a strict majority nothing is provable and the old, safe
   behaviour stays.
2. **bitflip-breakpoint** (fixed): one flipped bit kept the size and the zip structure valid, and
   `torch.load` does not check the zip's CRC-32, so every rank resumed from damaged weights and the
   job exited 0 with a wrong hash. The PyTorch example now writes a `<file>.sha256` sidecar
   (atomically, before the checkpoint) and verifies it on load; the planner verifies the sidecar of
   every file it picks, drops a mismatching one and plans again, with a warning
   (`--checkpoint-marker '{name}.sha256'` makes the sidecar mandatory). The MindSpore example turns
   on `crc_check` (MindSpore 2.10's `exception_save` writes no CRC into breakpoint files, so a
   breakpoint sidecar remains to do).
3. **truncated-breakpoint**: with the majority rule, the intact replicas of the breakpoint are used
   and no step is lost (before: the whole step was ruled out and up to 20 steps recomputed).
4. **MindSpore worker fault**: up to `--save-steps` steps are recomputed, not 0, and recovery takes
   `--stop-timeout` longer. This is MindSpore's CPU limit 6 (a peer blocked in a CPU collective
   ignores SIGTERM), not the launcher's.
5. **A SIGKILLed launcher leaves no `stop` in `events.jsonl`**; the next launcher on the same run dir
   records `unclean_previous_run` at its start.
6. **DCP across world sizes**: no defect found. Every resume loaded exactly the planned step
   (compared with its offline reshard), the incomplete step was skipped with a warning, and the
   loss after 4 -> 2 -> 3 ranks stayed within 1.6e-7 relative of the 4-rank reference. The checks
   were shown to fail on injected defects (each run once, then reverted): a planner that ignores
   `.metadata` (dcp-incomplete-step fails: the step without it is planned, and its ranks fail to
   load it, so the launcher restarts them);
   no `conversion` for a DCP step from another world (dcp-launcher-sigkill-shrink-4to2 fails);
   the example resuming without its AdamW state (dcp-rank-sigkill fails bit-identity from step 17,
   the 2-rank resume fails the loss tolerance at 3.4e-1 relative); one parameter shard moved by
   1e-6 after the load (dcp-rank-sigkill fails the comparison with the offline reshard).
"""
