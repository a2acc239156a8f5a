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


def test_a_report_is_known_to_come_after_an_event_only_when_it_came_as_one(tmp_path):
    """``reported_after`` orders a report against a file's last event: only a report read as an
    inotify event has a place in that order; one found by listing the directory has none."""
    (tmp_path / ".saves").mkdir()
    (tmp_path / ".saves" / "0.8.ckpt-1_100.pt").touch()
    reports = Reports(str(tmp_path))
    reports.refresh(lambda stamp: stamp)
    assert reports.files(0) == {"ckpt-1_100.pt": 8}
    assert not reports.reported_after(0, "ckpt-1_100.pt", -1)  # listed: when it was made is unknown
    reports.event("1.8.ckpt-1_200.pt", True, 5)
    assert reports.reported_after(1, "ckpt-1_200.pt", 4)
    assert not reports.reported_after(1, "ckpt-1_200.pt", 5)  # the file changed after its report
    assert not reports.reported_after(1, "ckpt-1_100.pt", 0) and not reports.reported_after(2, "ckpt-1_200.pt", 0)
    reports.event("1.8.ckpt-1_200.pt", False, 6)  # withdrawn
    assert not reports.reported_after(1, "ckpt-1_200.pt", 0)
    reports.event("1.8.ckpt-1_200.pt", True, 7)
    reports.lost()  # events lost: none is trusted to say when its report came
    assert not reports.reported_after(1, "ckpt-1_200.pt", 0)
