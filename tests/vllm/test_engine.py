"""The real vLLM engine (CPU, float32, greedy) on a checkpoint trained here: its plain tokens equal our
NTP decoder's (the faithful checkpoint, as save_pretrained wrote it), and with the LZ processor
(loaded through the installed entry point) they equal rpt.sampling.generate's with the same LZ
settings, with continuous batching reusing rows. One engine for the module."""

import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate
from tests.helpers.train_helpers import run_train, write_config

pytestmark = pytest.mark.vllm

NEW = 24
MAX_SEQS = 3  # fewer than the requests: rows are freed, refilled and moved


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    # head_dim 32 (64 / 2 heads): vLLM's CPU attention takes 32, 64, 80, ...; tied embeddings, the
    # case a faithful checkpoint saves untied
    model = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256,
             "tie_word_embeddings": True}
    res = run_train(write_config(tmp, model=model, max_steps=40, eval_every=40, save_every=40, warmup_steps=4))
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "run" / "final"


@pytest.fixture(scope="module")
def llm(checkpoint):
    from vllm import LLM

    return LLM(str(checkpoint), dtype="float32", max_model_len=256, max_num_seqs=MAX_SEQS, enforce_eager=True, seed=0)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return RPTForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()


def prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, 300, (int(length),), generator=g).tolist()
            for length in torch.randint(1, 40, (n,), generator=g)]


def budget(i: int) -> int:
    return NEW - 5 * (i % 4)  # rows finish at different steps: vLLM moves rows to close the gaps


def vllm_tokens(llm, requests):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=budget(i), ignore_eos=True, extra_args=extra)
              for i, (_, extra) in enumerate(requests)]
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def our_tokens(model, prompt, extra, new=NEW):
    config = SamplingConfig(max_new_tokens=new, eos_token_id=[], **(extra or {}))
    return generate(model, torch.tensor([prompt]), config).generated(0)


LZ = [
    {"lz_penalty": 1.0, "lz_window": 16, "lz_buffer": 4},
    {"lz_penalty": 0.5, "lz_window": 512, "lz_buffer": 32, "lz_include_prompt": True},
    {"lz_penalty": 2.0, "lz_window": 12, "lz_buffer": 2, "lz_variant": "closest_longest"},
]


def test_plain_greedy_tokens_equal_our_ntp_decoder(llm, ours):
    """The checkpoint loads with no file moved (the table sits in rpt_table/), as the trained NTP model."""
    ps = prompts(6)
    assert vllm_tokens(llm, [(p, None) for p in ps]) == [our_tokens(ours, p, None, budget(i)) for i, p in enumerate(ps)]


def test_lz_requests_mixed_with_plain_ones_equal_our_decoder(llm, ours, monkeypatch):
    from rpt.integrations.lz_rows import LZRows

    moves = []  # the batch changes the processor saw: the rows really were reused and moved
    for name in ("add", "move", "swap"):
        original = getattr(LZRows, name)
        monkeypatch.setattr(LZRows, name, lambda self, *a, _o=original, _n=name: (moves.append(_n), _o(self, *a))[1])
    ps = prompts(10)
    requests = [(p, LZ[i % 3] if i % 5 != 4 else None) for i, p in enumerate(ps)]  # 8 with LZ, 2 without
    got = vllm_tokens(llm, requests)
    plain_alone = vllm_tokens(llm, [(p, None) for p in ps])
    changed = 0
    for i, ((prompt, extra), tokens, plain) in enumerate(zip(requests, got, plain_alone)):
        if extra is None:
            assert tokens == plain  # untouched by the LZ rows beside it
        else:
            assert tokens == our_tokens(ours, prompt, extra, budget(i)), (i, extra)
            changed += tokens != plain
    assert changed >= 4  # the penalty did change what was decoded: the comparison means something
    assert moves.count("add") == 20 and moves.count("move") + moves.count("swap") > 0, moves


def test_a_bad_lz_setting_is_refused_with_the_processors_message(llm):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # HTTP 400 under `vllm serve`

    bad = SamplingParams(max_tokens=4, extra_args={"lz_penalty": 0.15, "lz_window": 0})
    with pytest.raises(VLLMValidationError, match=r"extra_args lz_window=0 is invalid: use an integer >= 1"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], bad, use_tqdm=False)
