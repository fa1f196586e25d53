"""Installed but not selected, the plugin changes nothing: vLLM's plain server gives the same completions with the
plugin loaded as with vLLM's plugin whitelist leaving it out (`scripts.inert`), and leaving it out really does (a
server asked for one of our methods then fails to start)."""

import pytest

from scripts import inert
from scripts.trained_models import copy
from scripts.vllm_server import vllm_server


@pytest.mark.sweep  # a long run (two servers taking turns); CI checks the same in tests/vllm/test_vllm_config.py
def test_unselected_plugin_changes_nothing(tmp_path):
    model = copy(tmp_path / "models")["ar"]
    result = inert.compare("vllm", model, rounds=1, count=8, max_tokens=32)
    assert result.identical and all(result.tokens_per_second.values())
    with (pytest.raises(RuntimeError, match="did not start"),
          inert.whitelisted("vllm", with_plugin=False),
          vllm_server(model, {"method": "jacobi", "block_size": 4}, timeout=120)):
        pass
