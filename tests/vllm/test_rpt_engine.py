"""RPT inside the real vLLM engine (CPU build, float32) on a tiny untied random Llama with a random
offset table, window 3: every request's tokens equal rpt.sampling.generate's and generate_reference's
(greedy, and seeded at temperature 0.8), in one engine that reuses and moves rows (max_num_seqs=3),
is forced into preemption (few KV blocks), ends requests at max_tokens and at an EOS inside the
window, and serves plain requests beside them; bad settings are refused per request while the
others run exactly. One engine for the module."""

import importlib.metadata

import pytest
import torch

from rpt.model import RPTForCausalLM
from rpt.sampling import SamplingConfig, generate
from rpt.sampling.reference import generate_reference

pytestmark = pytest.mark.vllm

NEW = 24
V = 512
LENGTHS = (1, 2, 5, 11, 23, 40)
SETTINGS = [(1, 2, 0.3), (1, 3, 0.3), (2, 3, 0.5), (1, 3, 0.9)]


def save_checkpoint(path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers.tiny_models import tiny_tokenizer

    torch.manual_seed(0)
    # head_dim 32 (64 / 2 heads): vLLM's CPU attention takes 32, 64, 80, ...; EOS id 0 in the config and
    # the tokenizer, so the engine and our decoder stop at the same id
    config = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False,
                         initializer_range=0.4, eos_token_id=0, bos_token_id=1)
    model = RPTForCausalLM.from_base(LlamaForCausalLM(config), window=3)
    with torch.no_grad():
        model.offset_embedding.weight.normal_(0, 0.5)
    model.save_pretrained(path)
    tiny_tokenizer(300).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("rpt-ckpt"))


@pytest.fixture(scope="module")
def ours(checkpoint):
    return RPTForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(checkpoint):
    from vllm import LLM

    from rpt.integrations.vllm_rpt.launch import rpt_engine_args

    # 5 blocks of 32 tokens for 3 requests of up to 70 tokens (3 blocks each): the scheduler must preempt
    return LLM(**rpt_engine_args(checkpoint, dtype="float32", max_model_len=128, max_num_seqs=3, block_size=32,
                                 num_gpu_blocks_override=5, enable_prefix_caching=False, seed=0))


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(1, 300, (n,), generator=g).tolist() for n in LENGTHS]


def budget(i: int) -> int:
    return NEW - 3 * (i % 3)  # requests end at max_tokens at different steps


def references(model, prompt, config):
    ids = torch.tensor([prompt])
    fast, ref = generate(model, ids, config), generate_reference(model, ids, config)
    assert fast.generated(0) == ref.generated(0)  # the two project decoders agree
    return ref.generated(0), ref.stats["corrections"]


def run(llm, requests):
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], [s for _, s in requests], use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], outs


def test_the_plugin_entry_point_is_installed():
    plugins = {e.name: e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert plugins.get("rpt_vllm") == "rpt.integrations.vllm_rpt.plugin:register"


def test_rpt_requests_equal_our_decoders_greedy_seeded_preempted(llm, ours, monkeypatch):
    from vllm import SamplingParams

    from rpt.integrations.vllm_rpt.scheduler import RPTScheduler

    preempted = []
    original = RPTScheduler._preempt_request
    monkeypatch.setattr(RPTScheduler, "_preempt_request",
                        lambda self, request, *a, **k: (preempted.append(request.request_id),
                                                        original(self, request, *a, **k))[1])
    requests, expected, corrections = [], [], 0
    for i, (prompt, (k, w, eta)) in enumerate((p, s) for p in prompts() for s in SETTINGS):
        extra = {"rpt_iters": k, "rpt_window": w, "confidence": eta}
        requests.append((prompt, SamplingParams(temperature=0, max_tokens=budget(i), ignore_eos=True, extra_args=extra)))
        tokens, made = references(ours, prompt, SamplingConfig(max_new_tokens=budget(i), eos_token_id=[], **extra))
        expected.append(tokens)
        corrections += made
    for seed, prompt in zip((5, 6, 7), prompts()[2:5]):  # seeded sampling: our keyed draws, reproduced
        extra = {"rpt_iters": 2, "rpt_window": 3, "confidence": 0.3}
        requests.append((prompt, SamplingParams(temperature=0.8, seed=seed, max_tokens=NEW, ignore_eos=True,
                                                extra_args=extra)))
        tokens, made = references(ours, prompt, SamplingConfig(max_new_tokens=NEW, eos_token_id=[], temperature=0.8,
                                                               seed=seed, **extra))
        expected.append(tokens)
        corrections += made
    for prompt in prompts()[:3]:  # plain requests beside them: the NTP model, untouched
        requests.append((prompt, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)))
        expected.append(generate(ours, torch.tensor([prompt]), SamplingConfig(max_new_tokens=NEW, eos_token_id=[]))
                        .generated(0))
    got, outs = run(llm, requests)
    for i, (tokens, want) in enumerate(zip(got, expected)):
        assert tokens == want, (i, requests[i][1].extra_args)
    assert corrections >= 5  # the references replaced tokens: replacement was exercised
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert preempted, "no request was preempted: the KV budget no longer forces preemption"


def test_eos_inside_the_window_flushes_as_our_decoder(llm, ours):
    from vllm import SamplingParams

    extra = {"rpt_iters": 1, "rpt_window": 3, "confidence": 0.3}
    requests, expected = [], []
    for prompt in prompts()[1:4]:
        free, _ = references(ours, prompt, SamplingConfig(max_new_tokens=NEW, eos_token_id=[], **extra))
        stop = free[7]  # reached mid-decode: the row stops there with tokens still in its window
        want, _ = references(ours, prompt, SamplingConfig(max_new_tokens=NEW, eos_token_id=[0, stop], **extra))
        assert want[-1] == stop and len(want) < NEW
        requests.append((prompt, SamplingParams(temperature=0, max_tokens=NEW, stop_token_ids=[stop], extra_args=extra)))
        expected.append(want)
    got, outs = run(llm, requests)
    assert got == expected
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


@pytest.mark.parametrize("extra,message", [
    ({"rpt_iters": 1, "rpt_window": 4}, r"rpt_window=4 is larger than the window 3"),
    ({"rpt_iters": 1, "confidence": 1.5}, r"confidence=1.5 is invalid"),
    ({"rpt_iters": 1, "confidence": float("nan")}, r"confidence=nan is invalid: use a finite number"),
    ({"rpt_iters": 10**6}, r"rpt_iters=1000000 is above the engine's bound"),
    ({"rpt_iters": 1, "lz_penalty": 0.2}, r"lz_penalty together with rpt_iters"),
])
def test_bad_settings_are_refused_at_admission(llm, extra, message):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # HTTP 400 under `vllm serve`

    with pytest.raises(VLLMValidationError, match=message) as info:
        llm.generate([{"prompt_token_ids": [3, 4]}], SamplingParams(max_tokens=4, extra_args=extra), use_tqdm=False)
    assert "\n" not in str(info.value)


def test_unsupported_features_are_refused_per_request(llm):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    extra = {"rpt_iters": 1}
    for kwargs, message in (({"logprobs": 2}, "logprobs"), ({"stop": ["x"]}, "stop strings"),
                            ({"presence_penalty": 0.5}, "presence_penalty")):
        with pytest.raises(VLLMValidationError, match=message):
            llm.generate([{"prompt_token_ids": [3, 4]}], SamplingParams(max_tokens=4, extra_args=extra, **kwargs),
                         use_tqdm=False)


def test_a_request_refused_inside_the_engine_leaves_the_others_exact(llm, ours, monkeypatch):
    """Where admission cannot see the engine (its caller changed), the scheduler refuses against the
    checkpoint: that request finishes with the error, the others with their exact tokens."""
    from vllm import SamplingParams

    from rpt.integrations.vllm_rpt import admission

    monkeypatch.setattr(admission, "admitting_config", lambda: None)
    good = {"rpt_iters": 1, "rpt_window": 3, "confidence": 0.3}
    ps = prompts()[:3]
    requests = [(ps[0], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, extra_args=good)),
                (ps[1], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True,
                                       extra_args={"rpt_iters": 1, "rpt_window": 4})),
                (ps[2], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, extra_args=good))]
    got, outs = run(llm, requests)
    for i in (0, 2):
        assert got[i] == references(ours, requests[i][0], SamplingConfig(max_new_tokens=NEW, eos_token_id=[], **good))[0]
    assert got[1] == [] and outs[1].outputs[0].finish_reason == "error"
    assert "rpt_window=4 is larger than the window 3" in str(outs[1].outputs[0].stop_reason)


def test_a_vllm_outside_the_checked_range_is_refused_in_one_line():
    from rpt.integrations.vllm_rpt.internals import check_version

    check_version("0.32.0+cpu")
    for version in ("0.31.2", "0.34.0"):
        with pytest.raises(RuntimeError, match=r"supports vLLM >=0.32.0,<0.34.0") as info:
            check_version(version)
        assert "\n" not in str(info.value)
