"""Fixtures of the integration tests, which run the real ``launcher`` with real child processes
(through the one harness, ``tests/helpers/launch.py``)."""

import os
from pathlib import Path

import pytest

from tests.helpers.launch import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    """A ``launcher run`` whose files live in the test's tmp dir (killed if the test leaves it running)."""
    return Launcher(tmp_path)


os.environ.setdefault("PYTHONUNBUFFERED", "1")
