"""Unit tests of the command line (launcher.commands)."""
