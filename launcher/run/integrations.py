"""Which integrations (``launcher.supervision.integration``) one ``launcher run`` gets, in start order.

Those every run starts are imported with this module; those only some options or files call for
(reset.json's follower where the cluster mounts it, the Prometheus metrics) are imported only for a
run that uses them, so a run without them does not pay their imports on its way to the first rank.
"""

import os
from typing import List, Tuple

from launcher.cluster.syncjoin import SyncCoordination
from launcher.cluster.taskd import TaskdManager
from launcher.control.server import ControlChannel
from launcher.jobspec.options import DEFAULT_RESET_JSON
from launcher.jobspec.runspec import RunSpec
from launcher.run.hangwatch import HangWatch
from launcher.run.outputwatch import OutputWatch
from launcher.supervision.integration import Integration


def follows_reset_json(path: str) -> bool:
    """Whether a run follows reset.json at ``path`` (``--reset-json``): a path given by the user always;
    the default path only where its directory is mounted (a MindCluster pod)."""
    return bool(path) and (path != DEFAULT_RESET_JSON or os.path.isdir(os.path.dirname(path)))


def run_integrations(spec: RunSpec) -> Tuple[List[Integration], SyncCoordination]:
    """The integrations of a run of ``spec`` in start order, and its cross-node coordination (a member too,
    which the session also asks for the elastic membership each attempt runs on)."""
    sync = SyncCoordination()
    members: List[Integration] = [ControlChannel()]
    if follows_reset_json(spec.restore.reset_json_path or ""):
        from launcher.cluster.resetfollow import ResetJsonFollower

        members.append(ResetJsonFollower())
    members += [sync, TaskdManager(), HangWatch(), OutputWatch()]
    if spec.output.metrics_port is not None or spec.output.metrics_textfile:
        from launcher.run.metrics import Metrics

        members.append(Metrics(spec.output.metrics_port, spec.output.metrics_textfile))
    return members, sync
