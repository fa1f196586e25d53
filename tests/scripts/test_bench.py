"""`scripts.bench --quick` runs vLLM with a method, its AR baseline and its ngram peer on the trained checkpoint and
writes every field the benchmark promises."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parallel_decoding.common.quadratic_self_spec import QuadraticSelfSpecConfig, quadratic_forward
from scripts import bench_huginn
from scripts.alternating import alternate
from scripts.bench import METHODS, histogram, summarise
from scripts.profile_step import rows_width, with_peer_ratio
from tests.support.fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parents[2]


def test_histogram_from_per_position_counts():
    assert histogram(10, [6, 3, 1]) == [4, 3, 2, 1]  # steps accepting 0, 1, 2, 3 drafts


def test_repeats_keep_the_median_run_against_its_own_ar():
    """`--repeats 3`: each record is the run whose speedup over the AR of the same repeat is the median, with every
    repeat's speedup beside it (a slow machine phase slows AR and the method alike)."""
    def run(tps: float) -> dict:
        return {"tokens_per_second": tps, "tokens_per_forward": 2.0}

    runs = {(8, "nld", "ar"): [run(100.0), run(50.0), run(80.0)],
            (8, "nld", "jacobi"): [run(90.0), run(60.0), run(100.0)]}
    records = summarise("vllm", runs, {(8, "nld", "ar"): None, (8, "nld", "jacobi"): {"method": "jacobi"}})
    ar, jacobi = records
    assert ar["speedups"] == [1.0, 1.0, 1.0] and ar["speedup"] == 1.0
    assert jacobi["speedups"] == [0.9, 1.2, 1.25] and jacobi["speedup"] == 1.2
    assert jacobi["tokens_per_second"] == 60.0 and jacobi["conversion"] == 0.6
    assert jacobi["config"] == {"method": "jacobi"} and jacobi["batch_size"] == 8


def test_alternating_runs_are_set_beside_ar_round_by_round():
    """vLLM's engines up at once (`--engine vllm`): a repeat's speedup is the median of its rounds' ratios to AR's
    rounds, not the ratio of their totals (one slow round of AR's would carry it)."""
    def run(rounds: list[float]) -> dict:
        return {"tokens_per_second": sum(rounds) / len(rounds), "tokens_per_forward": 1.0,
                "rounds_tokens_per_second": rounds}

    runs = {(8, "nld", "ar"): [run([100.0, 100.0, 20.0])], (8, "nld", "jacobi"): [run([90.0, 95.0, 19.0])]}
    jacobi = summarise("vllm", runs, {(8, "nld", "ar"): None, (8, "nld", "jacobi"): {"method": "jacobi"}})[1]
    assert jacobi["speedup"] == 0.95 and jacobi["speedups"] == [0.95]


def test_an_adaptive_method_is_set_beside_its_pinned_width_in_the_same_run():
    """`over_fixed`: the method's rounds over its pinned width's (`NAME-fixed`) of the same repeat, median over
    rounds, then over repeats; a record without a pinned run has none."""
    def run(rounds: list[float]) -> dict:
        return {"tokens_per_second": sum(rounds) / len(rounds), "tokens_per_forward": 1.0,
                "rounds_tokens_per_second": rounds}

    runs = {(1, "nld", "ar"): [run([10.0, 10.0, 10.0])] * 3,
            (1, "nld", "jacobi"): [run([20.0, 30.0, 10.0]), run([20.0, 20.0, 20.0]), run([40.0, 40.0, 40.0])],
            (1, "nld", "jacobi-fixed"): [run([20.0, 20.0, 20.0]), run([40.0, 20.0, 40.0]), run([40.0, 40.0, 40.0])]}
    specs = {(1, "nld", "ar"): None, (1, "nld", "jacobi"): {"method": "jacobi"},
             (1, "nld", "jacobi-fixed"): {"method": "jacobi", "adaptive": False}}
    ar, jacobi, fixed = summarise("vllm", runs, specs)
    assert jacobi["over_fixed_runs"] == [1.0, 0.5, 1.0] and jacobi["over_fixed"] == 1.0
    assert "over_fixed" not in ar and "over_fixed" not in fixed


def test_alternate_keeps_engines_up_and_rotates_their_rounds(tmp_path):
    """Every engine is built once and times one batch a round, round r starting from the r-th engine; each record
    carries its rounds' rates; an engine's failure is raised with its name."""
    log = tmp_path / "log"
    engines = {name: (FakeEngine, (name, str(log), rate)) for name, rate in (("ar", 10.0), ("a", 20.0), ("b", 5.0))}
    records = alternate(engines, 4)
    assert log.read_text().split() == ["ar", "a", "b", "a", "b", "ar", "b", "ar", "a", "ar", "a", "b"]
    assert records["a"] == {"name": "a", "rounds": 4, "rounds_tokens_per_second": [20.0] * 4}
    with pytest.raises(RuntimeError, match="engine broken failed"):
        alternate({"broken": (FakeEngine, ("broken", str(log), 1.0))}, 1)


def test_huginn_record_against_ar():
    """`--model huginn`'s record of a sampler: speedup over `ar`'s tokens/s, sequential core passes per token of a
    request (the batch shares each pass), agreement with `ar` by position; only the wavefront takes the bound."""
    ar = {"token_ids": [[1, 2, 3, 4], [5, 6, 7, 8]], "seconds": 2.0, "core_passes": 128}
    wavefront = {"token_ids": [[1, 2, 3, 4], [5, 6, 0, 8]], "seconds": 1.0, "core_passes": 20}
    spec = bench_huginn.settings("wavefront", 32, 64)
    got = bench_huginn.record("vllm", spec, 2, wavefront, ar)
    assert spec["max_diffusion_steps"] == 64 and "max_diffusion_steps" not in bench_huginn.settings("adaptive", 32, 64)
    assert got["method"] == "wavefront" and got["checkpoint"] == "raven"
    assert got["speedup"] == 2.0 and got["core_passes_per_token"] == 5.0
    assert got["agreement_with_ar"] == 7 / 8 and bench_huginn.record("vllm", spec, 2, ar, ar)["speedup"] == 1.0


def test_quadratic_is_profiled_beside_ngram_at_its_forward_width():
    """Quadratic self-speculation's widest forward (a chain of k, a group of k + 1 per chain token) is the rows
    ngram forwards at `rows_width` drafts; its step is set beside that ngram's too."""
    spec = next(spec for name, _, spec in METHODS if name == "diffusion_self_quadratic")
    k = spec["num_speculative_tokens"] + 1
    widest = quadratic_forward(list(range(k)), 0, QuadraticSelfSpecConfig(block_size=k, mask_token_id=0))
    assert rows_width(spec) + 1 == widest.num_tokens and rows_width({"method": "diffusion_self"}) is None
    runs = [{"checkpoint": "nld", "method": name, "batch_size": 8, "step_ms": step, "hooks_ms": 1.0, "engine_ms": 1.0,
             "forwards_per_step": 1.0, **roles}
            for name, step, roles in [("quadratic", 6.0, {"peer": "ngram-3", "rows_peer": "ngram-23"}),
                                      ("ngram-3", 2.0, {}), ("ngram-23", 4.0, {})]]
    quadratic = with_peer_ratio(runs)[0]
    assert quadratic["per_step_vs_ngram"] == 3.0 and quadratic["per_step_vs_ngram_rows"] == 1.5


@pytest.mark.sweep  # a bench run of a vLLM engine (three servers' worth of startups), not in CI's budget
def test_quick_bench(tmp_path):
    out = subprocess.run([sys.executable, "-m", "scripts.bench", "--engine", "vllm", "--models", str(tmp_path / "m"),
                          "--json", str(tmp_path / "b.json"), "--png", str(tmp_path / "b.png"), "--quick",
                          "--methods", "jacobi", "--sync-ar"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    records = {r["method"]: r for r in json.loads((tmp_path / "b.json").read_text())}
    assert set(records) == {"ar", "ar-sync", "jacobi", "jacobi-fixed", "ngram-8"}
    # AR as vLLM runs any plugin method, without async scheduling (`--sync-ar`; on CPU vLLM runs AR so anyway).
    assert not records["ar-sync"]["async_scheduling"] and not records["jacobi"]["async_scheduling"]
    jacobi, fixed = records["jacobi"], records["jacobi-fixed"]
    assert jacobi["checkpoint"] == "jacobi_forcing" and jacobi["tokens_per_forward"] > 1.0
    assert jacobi["conversion"] == jacobi["speedup"] / jacobi["tokens_per_forward"]
    assert sum(fixed["acceptance_histogram"]) > 0 and records["ar"]["speedup"] == 1.0
    assert all(len(r["rounds_tokens_per_second"]) == 1 for r in records.values())  # up at once, a round each
    assert jacobi["planner"]["steps"] > 0 and jacobi["planner"]["measured_steps"] > 0 and fixed["planner"] is None
    assert (tmp_path / "b.png").stat().st_size > 0


@pytest.mark.sweep  # a profiling run of two engines (`scripts.profile_step`), not in CI's budget
def test_profile_step_splits_each_step(tmp_path):
    """`scripts.profile_step` times jacobi and diffusion self-speculation, their ngram peers and AR over their decode
    steps: the parts add up to the step, each method's step is compared with ngram's, which on the periodic prompts
    drafts its full width, and per forward where a step runs two (the draft's and the verify's)."""
    out = subprocess.run([sys.executable, "-m", "scripts.profile_step", "--models", str(tmp_path / "m"),
                          "--json", str(tmp_path / "p.json"), "--methods", "jacobi,diffusion_self",
                          "--batch-sizes", "2", "--max-tokens", "12", "--prompts", "periodic"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = json.loads((tmp_path / "p.json").read_text())
    records = {r["method"]: r for r in runs if r["checkpoint"] == "jacobi_forcing"}
    assert set(records) == {"ar", "jacobi", "ngram-8"}
    for record in records.values():
        parts = sum(record[f"{part}_ms"] for part in ("forward", "extra_forward", "hooks", "engine"))
        assert abs(parts - record["step_ms"]) < 1e-6 and record["forward_ms"] > 0 and record["steps"] > 0
    jacobi = records["jacobi"]
    assert jacobi["per_step_vs_ngram"] == jacobi["step_ms"] / records["ngram-8"]["step_ms"]
    overhead = {name: r["step_ms"] - r["forward_ms"] - r["extra_forward_ms"] for name, r in records.items()}
    assert abs(jacobi["overhead_vs_ngram"] - overhead["jacobi"] / overhead["ngram-8"]) < 1e-9
    assert records["ar"]["rows_per_step"] == 2 and records["ar"]["steps"] == 11  # 12 tokens less the prefill's
    assert records["ngram-8"]["rows_per_step"] == 2 * 9 and jacobi["rows_per_step"] > 2
    assert all(r["forwards_per_step"] == 1 for r in records.values())
    assert jacobi["per_forward_vs_ngram"] == jacobi["per_step_vs_ngram"]
    nld = {r["method"]: r for r in runs if r["checkpoint"] == "nld"}
    self_spec, peer = nld["diffusion_self"], nld["ngram-7"]
    assert 1.5 < self_spec["forwards_per_step"] <= 2 and peer["forwards_per_step"] == 1  # no draft on the last step
    assert self_spec["extra_forward_ms"] > 0
    assert abs(self_spec["per_forward_vs_ngram"] * self_spec["forwards_per_step"]
               - self_spec["step_ms"] / peer["step_ms"]) < 1e-9


def test_profile_step_digest_times_both_paths(tmp_path):
    """`scripts.profile_step --part digest` times the batched digest and the per-request one on the same rows and
    reports both per method and batch size."""
    from scripts.profile_step import main

    main(["--part", "digest", "--device", "cpu", "--vocab", "256", "--batch-sizes", "1,3", "--steps", "4",
          "--json", str(tmp_path / "d.json")])
    report = json.loads((tmp_path / "d.json").read_text())
    assert {(r["method"], r["batch"]) for r in report["results"]} == {
        (m, b) for m in ("wedlm", "diffusion", "diffusion_self_quadratic", "jacobi") for b in (1, 3)}
    assert all(r["batched_ms"] > 0 and r["per_request_ms"] > 0 and r["rows_per_step"] > 0 for r in report["results"])


def test_reference_mode_times_the_reference_runner(tmp_path):
    """`--engine reference` times `common/`'s reference runner on the trained checkpoint, one request at a time, the
    methods in turn: AR at one token per forward, quadratic `diffusion_self` with its own count of forwards, both
    speeds measured round by round; a batch size above 1 is refused by name."""
    from scripts.bench import run_reference
    from scripts.trained_models import copy

    model = str(copy(tmp_path / "m")["nld"])
    spec = next(spec for name, _, spec in METHODS if name == "diffusion_self_quadratic")
    got = run_reference(model, {"ar": None, "ours": spec}, 1, 16, 2, ["def f(x):", "import os"])
    ar, ours = got["ar"], got["ours"]
    assert ar["tokens"] == ours["tokens"] == 32 and ar["tokens_per_forward"] < 1.1
    assert ours["tokens_per_forward"] > 1.2 and ours["tokens_per_second"] > 0
    assert len(ar["rounds_tokens_per_second"]) == len(ours["rounds_tokens_per_second"]) == 2  # set beside AR's
    with pytest.raises(SystemExit, match="--batch-sizes 1"):
        run_reference(model, {"ours": spec}, 8, 16, 1, ["import os"])
