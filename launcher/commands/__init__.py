"""The command line: the click group (``cli``) and one module per command group, loaded lazily.

May import: every layer below. Nothing in ``launcher`` imports ``launcher.commands`` but
``launcher.__main__``.
"""
