"""Unit tests of rank tables (launcher.jobspec.ranktable)."""
