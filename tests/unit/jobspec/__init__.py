"""Unit tests of the job description (launcher.jobspec)."""
