"""`scripts.gpu_row_cost` on CPU (`--quick`): its causal mask holds (a request's first row reads the same logits with
a draft row after it) and it reports every point and the fit the docs read."""

import json

from scripts import gpu_row_cost


def test_quick_run_reports_each_point_and_the_fit(tmp_path):
    out = tmp_path / "row_cost.json"
    assert gpu_row_cost.main(["--device", "cpu", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mask_check_max_abs_diff"] < 0.05
    points = {(p["batch"], p["rows"]) for p in report["per_point"]}
    assert points == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(p["ms"] > 0 for p in report["per_point"])
    assert set(report["fits"]["all"]) >= {"step_ms", "row_ms", "draft_row_ms"}
