"""Unit tests of one launcher run (launcher.run)."""
