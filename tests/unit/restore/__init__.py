"""Unit tests of the restore plan and the checkpoint index (launcher.restore)."""
