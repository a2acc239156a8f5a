"""Click commands, one module per command group; loaded lazily by ``launcher.cli``."""
