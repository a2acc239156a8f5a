"""Prometheus metrics of a run (``--metrics-port`` / ``--metrics-textfile``, off by default).

An :class:`Integration`: it counts from the events the Session passes it, so it needs nothing from the
supervisor. ``prometheus_client`` is the optional extra ``metrics`` and is imported only when metrics
are asked for: a plain ``launcher run`` does not pay for it, and a cluster image without it still runs
(asking for metrics without it is a usage error naming the extra). The HTTP server binds 127.0.0.1
only (a node-local scraper or a sidecar reads it; nothing is exposed off the node); the textfile is
rewritten atomically whenever a value in it changes and at the end (node_exporter's textfile collector).
"""

import logging
import time
from typing import Any, Callable, Dict, Mapping, Optional

from launcher.common.errors import UsageError
from launcher.supervision.integration import Host, Integration

log = logging.getLogger(__name__)


def _client():
    try:
        import prometheus_client
    except ModuleNotFoundError:
        raise UsageError("--metrics-port / --metrics-textfile need prometheus_client: "
                         "pip install 'ascend-launcher[metrics]'") from None
    return prometheus_client


class Metrics(Integration):
    """The run's metrics, served on ``port`` (0: any free port, announced in ``metrics_listening``) and/or
    written to ``textfile``.

    Metrics: ``launcher_restarts_total``, ``launcher_failures_total{cause}``, ``launcher_attempt``,
    ``launcher_gasps_total``, ``launcher_gasp_duration_seconds`` (gasp to gasp_done),
    ``launcher_time_lost_seconds_total`` (rank failure to the next attempt's ranks all spawned),
    ``launcher_heartbeat_age_seconds{rank}`` (from ``heartbeat`` events, when a source writes them),
    ``launcher_steps_recomputed_total`` (per failure: the failed attempt's ``step_last`` minus the
    next ``restore_plan``'s step; it counts only the failures where both are known, the goodput in
    status and the end-of-run line say "unknown" for the others), ``launcher_up``.
    """

    def __init__(self, port: Optional[int] = None, textfile: Optional[str] = None):
        prom = _client()
        self.port, self.textfile, self.host = port, textfile, None
        self.registry = prom.CollectorRegistry()
        self.restarts = prom.Counter("launcher_restarts", "Restarts of the ranks", registry=self.registry)
        self.failures = prom.Counter("launcher_failures", "Rank failures by cause", ["cause"], registry=self.registry)
        self.attempt = prom.Gauge("launcher_attempt", "The current attempt", registry=self.registry)
        self.gasps = prom.Counter("launcher_gasps", "Dying gasps", registry=self.registry)
        self.gasp_seconds = prom.Histogram("launcher_gasp_duration_seconds", "Dying gasp durations",
                                           buckets=(1, 5, 10, 30, 60, 120, 300), registry=self.registry)
        self.lost = prom.Counter("launcher_time_lost_seconds", "Seconds from a rank failure until the next "
                                 "attempt's ranks are all spawned", registry=self.registry)
        self.beat = prom.Gauge("launcher_heartbeat_age_seconds", "Seconds since each rank's last heartbeat",
                               ["rank"], registry=self.registry)
        self.recomputed = prom.Counter("launcher_steps_recomputed", "Steps re-run after failures (the failed "
                                       "attempt's last heartbeat step minus the step the next one resumed from)",
                                       registry=self.registry)
        self.up = prom.Gauge("launcher_up", "1 while the launcher runs", registry=self.registry)
        self._beats, self._failed_at, self._gasp_at, self._pending = {}, None, None, set()
        self._failed_attempts, self._last_steps = set(), {}
        self._server = None

    def start(self, host: Host) -> None:
        self.host = host
        self.up.set(1)
        if self.port is not None:
            prom = _client()
            self._server, _ = prom.start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
            self.port = self._server.server_port
            host.emit("metrics_listening", address=f"127.0.0.1:{self.port}")
            log.info("metrics on http://127.0.0.1:%d/metrics", self.port)

    def on_event(self, event: str, fields: Mapping[str, Any]) -> None:
        if self._count(event, fields):
            self._write()  # the textfile says what the HTTP endpoint says, not the last attempt's values

    def _count(self, event: str, fields: Mapping[str, Any]) -> bool:
        """Count one event; True when a value the textfile holds changed (heartbeat ages are computed
        when read, so a heartbeat alone does not rewrite the file)."""
        counter = self._COUNTERS.get(event)
        return counter is not None and counter(self, fields, time.time())

    def _attempt_start(self, fields: Mapping[str, Any], _now: float) -> bool:
        self.attempt.set(fields.get("attempt", 0))
        self._pending = set(fields.get("ranks") or ())
        return True

    def _rank_spawned(self, fields: Mapping[str, Any], now: float) -> bool:
        self._pending.discard(fields.get("rank"))
        if self._pending or self._failed_at is None:
            return False
        self.lost.inc(max(0.0, now - self._failed_at))
        self._failed_at = None
        return True

    def _rank_exited(self, fields: Mapping[str, Any], now: float) -> bool:
        if fields.get("state") != "failed":
            return False
        self.failures.labels(f"signal {fields['signal']}" if fields.get("signal")
                             else f"exit code {fields.get('exit_code')}").inc()
        self._failed_at = self._failed_at or float(fields.get("exited_at") or now)
        self._failed_attempts.add(fields.get("attempt"))
        return True

    def _step_last(self, fields: Mapping[str, Any], _now: float) -> bool:
        self._last_steps[fields.get("attempt")] = fields.get("step")
        return False

    def _restore_plan(self, fields: Mapping[str, Any], _now: float) -> bool:
        self._count_recomputed(fields)
        return True

    def _restart(self, _fields: Mapping[str, Any], _now: float) -> bool:
        self.restarts.inc()
        return True

    def _gasp(self, _fields: Mapping[str, Any], now: float) -> bool:
        self.gasps.inc()
        self._gasp_at = now
        return True

    def _gasp_done(self, _fields: Mapping[str, Any], now: float) -> bool:
        if self._gasp_at is None:
            return False
        self.gasp_seconds.observe(now - self._gasp_at)
        self._gasp_at = None
        return True

    def _heartbeat(self, fields: Mapping[str, Any], now: float) -> bool:
        rank = fields.get("rank")
        if rank is None:
            return False
        if rank not in self._beats:  # the age is computed at each scrape, not at the last event
            self.beat.labels(str(rank)).set_function(lambda r=rank: time.time() - self._beats[r])
        self._beats[rank] = now
        return False

    #: event -> its counter: ``(self, fields, now) -> whether a value in the textfile changed``.
    _COUNTERS: Dict[str, Callable[["Metrics", Mapping[str, Any], float], bool]] = {
        "attempt_start": _attempt_start, "rank_spawned": _rank_spawned, "rank_exited": _rank_exited,
        "step_last": _step_last, "restore_plan": _restore_plan, "restart": _restart, "gasp": _gasp,
        "gasp_done": _gasp_done, "heartbeat": _heartbeat,
    }

    def _count_recomputed(self, plan: Mapping[str, Any]) -> None:
        """The steps the attempt this plan starts re-runs, after a failure of the one before."""
        before = plan.get("attempt", 0) - 1
        last, resumed = self._last_steps.get(before), plan.get("step")
        if before in self._failed_attempts and isinstance(last, int) and isinstance(resumed, int):
            self.recomputed.inc(max(0, last - resumed))

    def stop(self) -> None:
        self.up.set(0)
        self._write()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _write(self) -> None:
        if self.textfile:
            try:
                _client().write_to_textfile(self.textfile, self.registry)  # temp file + rename
            except OSError as exc:
                log.warning("cannot write metrics to %s: %s", self.textfile, exc)
