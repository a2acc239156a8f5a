"""From ``run``'s parsed option values to ``RunOptions``: torchrun's and msrun's spellings translated.

One path for both parsers of ``run``'s command line, click's (``launcher.commands.run``) and the fast
one (``launcher.commands.fastrun``); it reads the option table through its generated index
(``launcher.commands.optionindex``), so neither click nor the table's click types are imported here.
"""

import logging
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from launcher.commands import msrun, torchrun
from launcher.commands.optionindex import ROWS
from launcher.common.errors import UsageError
from launcher.jobspec.options import RunOptions

log = logging.getLogger("launcher.commands.run")  # the lines say the same from either parser

#: The option table's handling of a foreign spelling (the ``handling`` of ``launcher.commands.optionrow.Row``).
OWN, MAPPED, INFO, REFUSED, NOT_YET = "own", "mapped", "info", "refused", "not yet"


def build_run_options(kwargs: Dict[str, Any], explicit: Sequence[str], environ: Mapping[str, str]) -> RunOptions:
    """The ``RunOptions`` of parsed values (every row's name -> value, and ``command``).

    Args:
        kwargs: The parsed values; consumed.
        explicit: Names of the options the user gave (command line, environment or --config file).
        environ: The environment (``PATH``, for a ``.py`` script's interpreter).

    Raises:
        UsageError: options the launcher cannot honour (one line each), a missing ``.py`` script.
    """
    if isinstance(kwargs["nnodes"], tuple):  # MIN:MAX: the table has MAX servers; MIN is elastic's floor
        kwargs["min_nodes"], kwargs["nnodes"] = kwargs["nnodes"]
    problems, given, msrun_used = foreign_options(kwargs)
    problems += torchrun.translate(kwargs, explicit, given["torchrun"])
    problems += msrun.translate(kwargs, explicit, given["msrun"], msrun_used)
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} options cannot be used here", problems)
    kwargs["command"] = torchrun.python_command(kwargs["command"], kwargs.pop("no_python"), kwargs.pop("module"),
                                                environ)
    if kwargs.get("framework"):
        kwargs["framework"] = kwargs["framework"].lower()
    return RunOptions(**kwargs)


def foreign_options(kwargs: Dict[str, Any]) -> Tuple[List[str], Dict[str, Dict[str, Any]], bool]:
    """Take torchrun's and msrun's spellings out of ``kwargs``: an info line for those accepted as
    they are, a problem for those refused.

    Returns:
        The problems, the mapped ones given (tool -> row name -> value), and whether any msrun-only
        option was given (which implies --framework mindspore).
    """
    problems: List[str] = []
    given: Dict[str, Dict[str, Any]] = {"torchrun": {}, "msrun": {}}
    msrun_used = False
    for row in ROWS:
        name, handling = row["name"], row["handling"]
        if handling == NOT_YET:
            if kwargs.get(name, row["default"]) != row["default"]:
                problems.append(f"{row['flag']} {kwargs[name]}: {row['note']}")
            continue
        if handling == OWN:
            continue
        value = kwargs.pop(name)
        if value is None or value is False:
            continue
        msrun_used = msrun_used or row["tool"] == "msrun"
        if handling == INFO:
            log.info("%s is %s's: %s", row["flag"], row["tool"], row["note"])
        elif handling == REFUSED:
            problems.append(f"{row['flag']} is {row['tool']}'s: {row['note']}")
        else:
            given[row["tool"]][name] = value
    return problems, given, msrun_used

