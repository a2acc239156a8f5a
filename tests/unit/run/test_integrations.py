"""Which integrations a run gets: those only some runs use are listed (and imported) only for them."""

import subprocess
import sys

from launcher.jobspec.options import RunOptions
from launcher.jobspec.runspec import run_spec
from launcher.run.integrations import follows_reset_json, run_integrations


def _names(opts: RunOptions) -> list:
    members, sync = run_integrations(run_spec(opts, {}))
    assert sync in members
    return [type(m).__name__ for m in members]


def test_the_default_reset_json_is_followed_only_where_its_directory_is_mounted(tmp_path, monkeypatch):
    assert not follows_reset_json("")
    assert follows_reset_json(str(tmp_path / "absent" / "reset.json"))  # given by the user: followed, even absent
    mounted = str(tmp_path / "config")
    monkeypatch.setattr("launcher.run.integrations.DEFAULT_RESET_JSON", f"{mounted}/reset.json")
    assert not follows_reset_json(f"{mounted}/reset.json")  # the cluster did not mount it: nothing to follow
    (tmp_path / "config").mkdir()
    assert follows_reset_json(f"{mounted}/reset.json")


def test_every_run_gets_the_same_integrations_in_order_and_the_optional_ones_only_when_asked(tmp_path):
    base = ["ControlChannel", "SyncCoordination", "TaskdManager", "HangWatch", "OutputWatch"]
    assert _names(RunOptions(command=("x",), reset_json=None)) == base
    followed = _names(RunOptions(command=("x",), reset_json=str(tmp_path / "reset.json")))
    assert followed == base[:1] + ["ResetJsonFollower"] + base[1:]
    assert _names(RunOptions(command=("x",), reset_json=None, metrics_textfile=str(tmp_path / "m.prom"))) == \
        base + ["Metrics"]


def test_a_plain_run_does_not_import_what_it_does_not_use():
    code = ("import sys; from launcher.jobspec.options import RunOptions; from launcher.jobspec.runspec import run_spec; "
            "from launcher.run.integrations import run_integrations; "
            "run_integrations(run_spec(RunOptions(command=('x',), reset_json=None), {})); "
            "print(sorted(m for m in sys.modules if m.startswith(('launcher.cluster.reset', 'launcher.run.metrics', "
            "'launcher.run.stackdump', 'launcher.monitoring.stacks', 'launcher.jobspec.ranktable.parse'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
