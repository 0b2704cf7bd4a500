"""README's "Serve with vLLM" code, run as written in a fresh interpreter (vLLM's own process
handling, the plugin found through its entry point), in an empty directory."""
import ast
import os
import re
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "README.md")


def test_the_readme_snippet_runs_as_written(tmp_path):
    if not os.path.exists(README):
        pytest.skip("README.md is not beside these tests")
    text = open(README).read()
    section = text.split("## Serve with vLLM", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["VLLM_LOGGING_LEVEL"] = "INFO"
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = [line for line in run.stdout.splitlines() if re.fullmatch(r"\[[\d, ]*\]", line)]
    assert printed, run.stdout[-3000:]
    tokens = ast.literal_eval(printed[-1])
    assert len(tokens) == 8 and all(isinstance(t, int) for t in tokens)
    assert "int8attn serves" in run.stderr + run.stdout      # the plugin's backend, not vLLM's
