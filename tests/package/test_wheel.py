"""The built wheel installs one import name, `parallel_decoding`, and the `parallel-decoding` command: nothing generic
(`common`, `vllm_plugin`, `sglang_plugin`, `common_ops`) lands in site-packages, and the engines' entry points name
the namespaced adapters."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_one_import_name(tmp_path):
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info beside its sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("common", "vllm_plugin", "sglang_plugin"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=600)
    wheel = zipfile.ZipFile(next(tmp_path.glob("parallel_decoding-*.whl")))
    names = wheel.namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {
        "parallel_decoding"}
    for module in ("common/generate.py", "common/models/raven.py", "vllm_plugin/config.py",
                   "sglang_plugin/models/stock.py"):
        assert f"parallel_decoding/{module}" in names
    assert not [name for name in names if name.endswith("common_ops.py") or "cpu_torchvision" in name]
    info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/entry_points.txt"))
    entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    for line in ("parallel-decoding = parallel_decoding.common.cli:main",
                 "parallel_decoding = parallel_decoding.vllm_plugin:register",
                 "parallel_decoding = parallel_decoding.sglang_plugin:register"):
        assert line in entry_points

    # Unpacked alone on the path (no site-packages, no repository): the namespaced modules import, generic ones don't.
    site = tmp_path / "site"
    wheel.extractall(site)
    probe = ("import importlib.util as u, parallel_decoding.common.cli as cli; "
             "print(cli.__file__, [m for m in ('common', 'vllm_plugin', 'sglang_plugin') if u.find_spec(m)])")
    run = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True)
    assert run.stdout.split()[0].startswith(str(site)) and run.stdout.rstrip().endswith("[]"), run.stdout


def test_the_command_lists_its_subcommands():
    console = Path(sys.executable).parent / "parallel-decoding"
    run = subprocess.run([str(console), "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "generate" in run.stderr and "assd-server" in run.stderr
    assert subprocess.run([str(console), "nonsense"], capture_output=True).returncode == 2
