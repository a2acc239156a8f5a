"""msrun habits for ``launcher run``: its command line after changing the program name.

msrun (MindSpore 2.10) spells its options with underscores; ``--master_addr``, ``--master_port``,
``--node_rank`` and ``--log_dir`` are the launcher's own options (``token_normalize_func``), the
others are rows ``msrun_*`` of ``launcher.commands.optiontable``, mapped here by :func:`translate`.
Any msrun-only option implies ``--framework mindspore``: msrun starts MindSpore's scheduler and
workers, which a MindSpore script's ``init()`` needs.
"""

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from launcher.commands.torchrun import map_binding
from launcher.common import envnames

log = logging.getLogger(__name__)

#: msrun's default ``--worker_num`` and ``--local_worker_num``.
MSRUN_DEFAULT_WORKERS = 8


def translate(kwargs: Dict[str, Any], explicit: Sequence[str], given: Mapping[str, Any], used: bool) -> List[str]:
    """Turn msrun's mapped options into ``run``'s own.

    Args:
        kwargs: The launcher's options, changed in place.
        explicit: Names of the options the user gave (command line, environment, --config file).
        given: The mapped msrun rows the user gave: row name -> value.
        used: Whether any msrun-only option was given (mapped, accepted or refused).

    Returns:
        One line per contradictory or unusable value (empty: all mapped).
    """
    if not used:
        return []
    problems = _framework(kwargs, explicit)
    problems.extend(_workers(kwargs, explicit, given))
    rank_env = dict(kwargs.get("rank_env") or ())
    if given.get("msrun_cluster_time_out") is not None:
        rank_env[envnames.MS_TOPO_TIMEOUT] = str(given["msrun_cluster_time_out"])
    if given.get("msrun_rank_table_file"):
        rank_env[envnames.RANK_TABLE_FILE] = given["msrun_rank_table_file"]
    kwargs["rank_env"] = tuple(sorted(rank_env.items()))
    if given.get("msrun_join") == "False":
        log.info("--join False: the launcher always waits for its ranks and reports how they ended "
                 "(msrun --join True)")
    problems.extend(_console(kwargs, explicit, given.get("msrun_tail_worker_log")))
    problems.extend(_binding(kwargs, explicit, given))
    return problems


def _console(kwargs: Dict[str, Any], explicit: Sequence[str], tail: Any) -> List[str]:
    """``--tail_worker_log 0,1``: the workers msrun tails to the console (-1: all)."""
    if tail is None or str(tail).strip() == "-1":
        return []
    if "console_ranks" in explicit:
        return ["--tail_worker_log and --console-ranks both choose the console's ranks: pass one of them"]
    try:
        kwargs["console_ranks"] = tuple(int(rank) for rank in str(tail).split(","))
    except ValueError:
        return [f"--tail_worker_log {tail!r}: expected -1 (every worker) or ranks like 0,1"]
    return []


def _binding(kwargs: Dict[str, Any], explicit: Sequence[str], given: Mapping[str, Any]) -> List[str]:
    """``--bind_core`` / ``--bind_numa True``: ``--bind-cores auto``; msrun's per-device tables are not read."""
    problems: List[str] = []
    for name in ("bind_core", "bind_numa"):
        value = given.get("msrun_" + name)
        if value is None or str(value).strip().lower() == "false":
            continue
        if str(value).strip().lower() == "true":  # msrun: bind by the environment, automatically
            problems.extend(map_binding(kwargs, explicit, "auto", f"--{name} {value}"))
        else:
            problems.append(f"--{name} {value!r}: msrun's per-device binding table is not read here; pass the "
                            "CPUs with --bind-cores LIST, or True for --bind-cores auto")
    return problems


def _framework(kwargs: Dict[str, Any], explicit: Sequence[str]) -> List[str]:
    framework = (kwargs.get("framework") or "").lower()
    if "framework" in explicit and framework not in ("", "mindspore"):
        return [f"msrun's options start a MindSpore job: drop --framework {framework}"]
    if framework != "mindspore":
        log.info("msrun's options: --framework mindspore (the ranks get MindSpore's scheduler and variables)")
    kwargs["framework"] = "mindspore"
    return []


def _workers(kwargs: Dict[str, Any], explicit: Sequence[str], given: Mapping[str, Any]) -> List[str]:
    """``--worker_num W --local_worker_num L``: L ranks here, W / L machines (msrun's defaults: 8 and 8).

    The launcher's ``--nproc-per-node`` / ``--nnodes`` may say the same; they may not say otherwise.
    """
    world, local = given.get("msrun_worker_num"), given.get("msrun_local_worker_num")
    if world is None and local is None and ("nproc_per_node" in explicit or kwargs.get("rank_table")):
        return []  # the launcher's own spellings say where the ranks come from
    problems, world, local, default = _sizes(kwargs, explicit, world, local)
    if local > world or world % local:
        problems.append(f"--worker_num {world}{default} is not a multiple of --local_worker_num {local}: the "
                        "launcher starts the same number of ranks on every machine")
        return problems
    nodes = world // local
    if nodes > 1 and "node_rank" not in explicit:
        problems.append(f"--worker_num {world}{default} over {nodes} machines: pass --node_rank on each machine "
                        "(0 on the --master_addr one); the launcher numbers ranks before they start")
    kwargs["nproc_per_node"], kwargs["nnodes"] = local, nodes
    return problems


def _sizes(kwargs: Mapping[str, Any], explicit: Sequence[str], world: Optional[int],
           local: Optional[int]) -> Tuple[List[str], int, int, str]:
    """msrun's sizes with its defaults filled in, from the launcher's own options where given.

    Returns:
        The contradictions, the job's ranks, the ranks per machine, and " (msrun's default)" when the
        job's ranks are msrun's default.
    """
    problems = []
    if local is None:
        # msrun's 8 local workers, never more than the job has (msrun would start them all)
        local = kwargs["nproc_per_node"] if "nproc_per_node" in explicit else min(world or MSRUN_DEFAULT_WORKERS,
                                                                                 MSRUN_DEFAULT_WORKERS)
    elif "nproc_per_node" in explicit and kwargs["nproc_per_node"] != local:
        problems.append(f"--local_worker_num {local} and --nproc-per-node {kwargs['nproc_per_node']} differ: "
                        "pass one of them")
    default = ""
    if world is None:
        default = "" if "nnodes" in explicit else " (msrun's default)"
        world = kwargs["nnodes"] * local if "nnodes" in explicit else MSRUN_DEFAULT_WORKERS
    elif "nnodes" in explicit and kwargs["nnodes"] * local != world:
        problems.append(f"--worker_num {world} and --nnodes {kwargs['nnodes']} x {local} ranks differ: pass one "
                        "of them")
    return problems, world, local, default
