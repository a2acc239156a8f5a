"""The control channel and the dying gasp.

Owns: ``server`` (the launcher's control socket), ``client`` (its json+socket client), ``prestop``
(what ``launcher prestop`` / ``exit`` do, with or without a live launcher) and ``gasp`` (the gasp gate,
the graceful-exit file, and the fallback gasp when the launcher is gone).

May import: ``launcher.supervision`` (the loop's event types only), ``launcher.monitoring``,
``launcher.jobspec``, ``launcher.common``. ``client`` and ``prestop`` stay lean (json and socket at
import time): ``launcher prestop`` runs them inside a preStop hook's grace period.
"""
