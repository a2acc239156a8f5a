"""Unit tests of events, goodput, status and the timeline (launcher.monitoring)."""
