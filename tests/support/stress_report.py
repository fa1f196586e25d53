"""What every load test asserts of a `scripts.stress` report."""

from scripts import stress


def check(report: stress.Report) -> None:
    assert not report.failures, report.failures[:3]
    assert not report.mismatches, report.mismatches[:3]
    assert report.completed >= 40 and report.disconnected >= 1
    # the probes see what the load holds, so that their zeros afterwards mean something
    assert report.peak_under_load["plugin_entries"] > 0 and report.peak_under_load["kv_usage"] > 0
    assert all(state[name] == 0 for state in report.idle_after_rounds
               for name in ("kv_usage", "in_flight", "plugin_entries")), report.idle_after_rounds
    assert report.still_serving

