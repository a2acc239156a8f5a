"""Chaos suite plumbing: the ``chaos`` marker and the per-run records.

Each chaos test fills a ``RunRecord`` (``chaos_record`` fixture) as it goes, so a failing run still
reports what it measured; its teardown report carries the records to ``tests/chaos/report.py``,
which prints the summary at the end of the session and, with ``CHAOS_WRITE_DOC=1`` and every chaos
test run, writes it to ``docs/chaos.md`` with the per-run details (opt-in, so ``make test`` leaves
the work tree clean).
"""

import time

import pytest

from tests.chaos.report import RunRecord, as_property


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: fault-injection runs of the real examples under the launcher "
                                       "(tests/chaos; bounded to a few minutes)")


@pytest.fixture
def chaos_record(request):
    """``chaos_record(framework, kind, run)`` -> a RunRecord kept for the session summary."""
    made = []
    start = time.time()

    def make(framework: str, kind: str, run: int) -> RunRecord:
        record = RunRecord(framework, kind, run)
        made.append(record)
        request.node._chaos_records = made  # one test may measure several faults in a row
        return record

    yield make
    end = time.time()
    for record in made:
        record.wall_s = end - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("chaos") is None:
        return
    for record in getattr(item, "_chaos_records", ()):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            if hasattr(report, "wasxfail"):
                record.outcome = "xfailed" if report.skipped else "XPASS"
            elif report.failed and "XPASS(strict)" in str(report.longrepr):
                record.outcome = "XPASS(strict): remove the xfail mark"
            else:
                record.outcome = report.outcome
        elif report.when == "teardown" and report.failed and record.outcome == "passed":
            record.outcome = "failed (teardown)"
    if report.when == "teardown" and getattr(item, "_chaos_records", None):
        # The records reach the summary (tests/chaos/report.py) on this report, also from an xdist worker.
        report.user_properties.append(as_property(item._chaos_records))


