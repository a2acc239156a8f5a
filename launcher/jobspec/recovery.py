"""Recovery strategy: what the supervisor does when a rank fails.

The values are MindCluster's ``recover-strategy`` annotation values. They come from
``--recover-strategy`` or, as the Ascend Operator injects them, from ``HIGH_AVAILABILITY`` (PyTorch),
``MS_ENABLE_TFT`` (MindSpore), ``PROCESS_RECOVER`` and ``ENABLE_RESTART_FAULT_PROCESS``. See the
README's "Recovery strategies" table for what each value does.
"""

import re
from typing import FrozenSet, Mapping, Optional

from launcher.common import envnames
from launcher.common.errors import UsageError
from launcher.common.records import record

RETRY = "retry"
RECOVER = "recover"
RECOVER_IN_PLACE = "recover-in-place"
DUMP = "dump"
EXIT = "exit"
ELASTIC = "elastic-training"
STRATEGIES = (RETRY, RECOVER, RECOVER_IN_PLACE, DUMP, EXIT, ELASTIC)

#: MindSpore's MS_ENABLE_TFT switches and the strategy each one asks of the launcher (inferred from
#: MindSpore's fault-tolerance docs: TTP saves the dying-gasp checkpoint, UCE retries in place,
#: ARF rebuilds the failed process).
_TFT_SWITCHES = {"TTP": DUMP, "UCE": RETRY, "ARF": RECOVER_IN_PLACE}


@record(frozen=True)
class RecoveryStrategy:
    """The strategies in force and where they came from."""

    values: FrozenSet[str]
    source: str

    @property
    def dump(self) -> bool:
        """Dying gasp on the healthy ranks before the group stops after a failure."""
        return bool(self.values & {DUMP, RECOVER, ELASTIC})

    @property
    def exit_on_failure(self) -> bool:
        """Stop and exit non-zero at once (Volcano reschedules the pod), ignoring --max-restarts."""
        return bool(self.values & {EXIT, RECOVER, ELASTIC})

    @property
    def in_place(self) -> bool:
        """Restart only the failed ranks (when the framework can re-join a running group)."""
        return RECOVER_IN_PLACE in self.values and not self.exit_on_failure

    def describe(self) -> str:
        """``retry,dump (from --recover-strategy)``."""
        return f"{','.join(v for v in STRATEGIES if v in self.values)} (from {self.source})"


def parse_strategies(text: str, source: str) -> FrozenSet[str]:
    """Comma-separated strategy names.

    Raises:
        UsageError: an unknown value (the message lists the known ones).
    """
    values = frozenset(v.strip().lower() for v in text.split(",") if v.strip())
    unknown = sorted(values - set(STRATEGIES))
    if unknown:
        raise UsageError(f"{source}: unknown recovery strategy {', '.join(map(repr, unknown))}",
                         [f"known strategies: {', '.join(STRATEGIES)}"])
    return values


def _from_tft(value: str) -> FrozenSet[str]:
    # MS_ENABLE_TFT looks like "{TTP:1,UCE:1,ARF:1}".
    switches = dict(re.findall(r"([A-Z]+)\s*:\s*(\d)", value.upper()))
    return frozenset(_TFT_SWITCHES[k] for k, v in switches.items() if v == "1" and k in _TFT_SWITCHES)


def resolve_strategy(option: Optional[str], environ: Mapping[str, str]) -> RecoveryStrategy:
    """``--recover-strategy``, else the operator's variables, else ``retry``."""
    if option:
        return RecoveryStrategy(parse_strategies(option, "--recover-strategy"), "--recover-strategy")
    values, sources = set(), []
    if environ.get(envnames.HIGH_AVAILABILITY):
        values |= parse_strategies(environ[envnames.HIGH_AVAILABILITY], envnames.HIGH_AVAILABILITY)
        sources.append(envnames.HIGH_AVAILABILITY)
    if environ.get(envnames.MS_ENABLE_TFT):
        values |= _from_tft(environ[envnames.MS_ENABLE_TFT])
        sources.append(envnames.MS_ENABLE_TFT)
    if environ.get(envnames.ENABLE_RESTART_FAULT_PROCESS, "").lower() == "on":
        values.add(RECOVER_IN_PLACE)
        sources.append(envnames.ENABLE_RESTART_FAULT_PROCESS)
    if environ.get(envnames.PROCESS_RECOVER, "").lower() == "on" and not values:
        values.add(RECOVER)  # process-level rescheduling with no finer choice
        sources.append(envnames.PROCESS_RECOVER)
    if not values:
        return RecoveryStrategy(frozenset({RETRY}), "default")
    return RecoveryStrategy(frozenset(values), "+".join(sources))
