"""Unit tests of the restart policy and the process mechanism (launcher.supervision)."""
