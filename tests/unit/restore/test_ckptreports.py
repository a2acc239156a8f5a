"""Saves the ranks report (``launcher.restore.ckptreports``): the per-rank view kept as events come."""

from hypothesis import given
from hypothesis import strategies as st

from launcher.restore.ckptreports import Reports, parse_report

EVENTS = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 8, 9]),
                            st.sampled_from(["ckpt-1_100.pt", "ckpt-1_200.pt", "x.ckpt"]), st.booleans()),
                  max_size=40)


@given(EVENTS)
def test_files_are_what_the_reports_present_say(events):
    """``files(rank)`` is kept up to date event by event (not rebuilt from every report of the rank
    at each call): it must equal what the set of present reports says, and be a copy."""
    reports, present = Reports("/nowhere"), set()
    for rank, size, name, created in events:
        report = f"{rank}.{size}.{name}"
        reports.event(report, created)
        (present.add if created else present.discard)(report)
        for r in range(3):
            sizes = {}
            for rep_rank, rep_size, rep_name in map(parse_report, present):
                if rep_rank == r:
                    sizes.setdefault(rep_name, set()).add(rep_size)
            expected = {n: next(iter(s)) if len(s) == 1 else None for n, s in sizes.items()}
            got = reports.files(r)
            assert got == expected
            got["other"] = 1  # the caller may keep or change its copy
            assert "other" not in reports.files(r)
        assert set(reports.reporting()) == {parse_report(p)[0] for p in present}
