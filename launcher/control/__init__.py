"""The control channel and the dying gasp.

Owns: ``server`` (the launcher's control socket), ``client`` (its json+socket client), ``prestop``
(what ``launcher prestop`` / ``exit`` do, with or without a live launcher) and ``gasp`` (the gasp gate,
graceful-exit file, and the fallback gasp when the launcher is gone).

May import: ``launcher.cluster`` is not needed and not allowed; ``launcher.supervision`` (event
types only), ``launcher.monitoring``, ``launcher.jobspec``, ``launcher.common``. ``client`` and
``prestop`` stay lean (json + socket at import): ``launcher prestop`` runs them in a preStop hook.
"""
