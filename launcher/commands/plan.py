"""``launcher plan``: print the restore plan for given inputs without starting anything."""

import json
import os
from typing import Any, Optional

import click
from click.core import ParameterSource

from launcher.common.errors import UsageError
from launcher.commands.optiontypes import RankListType
from launcher.jobspec.runspec import restore_spec
from launcher.restore import PlanInputs, compute_plan
from launcher.restore.checkpoints import DEFAULT_SETTLE_SECONDS
from launcher.restore.faults import DEFAULT_FAULT_NPUS_PATH, DEFAULT_RESET_JSON_PATH


def _check_report(ctx: click.Context, name: str, option: str, path: Optional[str]) -> None:
    """A missing report is an error only when the user named it."""
    given = ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE,
                                                ParameterSource.ENVIRONMENT)
    if given and not os.path.exists(path or ""):
        raise UsageError(f"{option}: {path or ''} does not exist")


@click.command("plan")
@click.option("--world-size", type=click.IntRange(min=1), required=True,
              help="Number of ranks.")
@click.option("--fault-npus", "fault_npus", metavar="PATH", default=DEFAULT_FAULT_NPUS_PATH,
              show_default=True, help="The cluster's fault-npus file (absent: no faults).")
@click.option("--reset-json", "reset_json", metavar="PATH", default=DEFAULT_RESET_JSON_PATH,
              show_default=True, help="The cluster's reset.json (absent: no faults).")
@click.option("--fault-ranks", type=RankListType(), default=(), metavar="LIST", help="More faulty ranks, e.g. 3,5.")
@click.option("--group-info-root", metavar="DIR",
              help="Directory of device<r>/group_info.pb files (MindSpore GROUP_INFO_FILE).")
@click.option("--groups-file", metavar="FILE", help='JSON/YAML {"groups": [[0,8],[1,9],...]}.')
@click.option("--dp", type=click.IntRange(min=1), help="Data-parallel size (derived if omitted).")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel size (default 1).")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel size (default 1).")
@click.option("--checkpoint-dir", metavar="DIR", help="Directory holding rank_<r>/ checkpoints.")
@click.option("--checkpoint-pattern", metavar="REGEX",
              help="File-name regex with (?P<step>...), optional (?P<epoch>...) and "
                   "(?P<breakpoint>...); replaces the defaults.")
@click.option("--checkpoint-marker", metavar="TEMPLATE",
              help="Completion-marker file name, e.g. '{name}.done'.")
@click.option("--settle-seconds", type=click.FloatRange(min=0), default=DEFAULT_SETTLE_SECONDS,
              show_default=True, help="Interval of the 'file still being written' check.")
@click.option("--strategy-file", metavar="FILE",
              help="MindSpore: this world's sharding-strategy file; a step another world wrote "
                   "(manifests/) is planned to be converted to it.")
@click.option("--rank", type=click.IntRange(min=0), help="Also print this rank's environment.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def plan(ctx: click.Context, world_size: int, settle_seconds: float, rank: Optional[int], as_json: bool,
         **options: Any) -> None:
    """Print the restore plan (sources, checkpoints, RESTORE_RANKS) for the given inputs."""
    if rank is not None and rank >= world_size:
        raise UsageError(f"--rank {rank} outside 0..{world_size - 1}")
    restore = restore_spec(options)  # as ``launcher run`` builds it from its options of the same names
    if restore.strategy_file is not None and not os.path.isfile(restore.strategy_file):
        raise UsageError(f"--strategy-file: {restore.strategy_file} is not a file")
    _check_report(ctx, "fault_npus", "--fault-npus", restore.fault_npus_path)
    _check_report(ctx, "reset_json", "--reset-json", restore.reset_json_path)
    result = compute_plan(PlanInputs(world_size=world_size, settle_seconds=settle_seconds,
                                     **vars(restore)))
    env = result.env_for(rank) if rank is not None else None
    if as_json:
        payload = result.to_json()
        if env is not None:
            payload["env"] = {"rank": rank, "variables": env}
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
        return
    click.echo(result.format_table())
    if env is not None:
        click.echo("")
        click.echo(f"environment of rank {rank}:" + ("" if env else " (none: fresh start)"))
        for name in sorted(env):
            click.echo(f"  {name}={env[name]}")
