"""Unit tests of shared low-level pieces (launcher.common)."""
