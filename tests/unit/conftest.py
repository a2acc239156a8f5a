"""Fixtures for unit tests that drive the CLI in-process."""

import logging
import os

import pytest

_CLEARED = {"RANK_TABLE_FILE", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
            "MASTER_PORT", "XDL_IP", "POD_IP", "framework", "MINDX_TASK_ID", "OMP_NUM_THREADS", "XDG_RUNTIME_DIR"}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No launcher/operator variables from the machine, and no MindCluster default rank table."""
    for name in list(os.environ):
        if name in _CLEARED or name.startswith(("LAUNCHER_", "MS_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    missing = str(tmp_path / "no-such-dir" / "hccl.json")
    monkeypatch.setattr("launcher.jobspec.options.DEFAULT_RANK_TABLE", missing)
    monkeypatch.setattr("launcher.jobspec.topology.DEFAULT_RANK_TABLE", missing)


@pytest.fixture(autouse=True)
def restore_launcher_logger():
    """``cli.main`` replaces the launcher logger's handlers; put them back after the test."""
    logger = logging.getLogger("launcher")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
