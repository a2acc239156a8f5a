"""One ``launcher run``: build the job, start what runs beside the ranks, supervise, restart, report.

Owns: ``runner`` (entry: options to a Session, and the dry run), ``session`` (one run's wiring),
``attempt`` (what one (re)start hands the ranks).

May import: every lower layer (``control``, ``restore``, ``cluster``, ``supervision``,
``monitoring``, ``jobspec``, ``common``); only ``launcher.commands`` imports it.
"""
