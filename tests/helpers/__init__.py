"""Test helpers shared by unit and integration tests (fake cluster file systems, ...)."""
