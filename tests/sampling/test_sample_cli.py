"""``sample.py`` end to end on a tiny checkpoint built here (random RPT Llama + a BPE trained here)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import sample
from rpt.model import RPTForCausalLM
from rpt.sampling.config import SamplingConfig
from rpt.sampling.decode.generate import generate
from rpt.sampling.randomness import row_seed
from tests.helpers.tiny_models import tiny_llama

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TEXT = [
    "def add(a, b):\n    return a + b\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.\n",
    "for i in range(10):\n    print(i * i)\n",
    "A train leaves the station at noon and travels at sixty miles per hour.\n",
]


def train_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """``rpt``: an RPT checkpoint (w=3); ``plain``: the same base model saved as a plain HF model."""
    root = tmp_path_factory.mktemp("ckpt")
    tokenizer = train_tokenizer()
    base = tiny_llama(vocab_size=len(tokenizer), initializer_range=0.4)
    model = RPTForCausalLM.from_base(base, window=3)
    with torch.no_grad():
        table = 0.3 * torch.randn(model.offset_embedding.weight.shape, generator=torch.Generator().manual_seed(0))
        model.offset_embedding.weight.copy_(table)
    paths = {"rpt": root / "rpt", "plain": root / "plain"}
    model.save_pretrained(paths["rpt"])
    base.save_pretrained(paths["plain"])
    for p in paths.values():
        tokenizer.save_pretrained(p)
    return {k: str(v) for k, v in paths.items()}


def run(capsys, *argv):
    code = sample.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_prompts(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


PROMPTS = [{"id": "a", "prompt": "def fib(n):"}, {"prompt": "The quick brown"}, {"id": 7, "prompt": "for i in"}]
RPT = ["--rpt-iters", 2, "--rpt-window", 3, "--confidence", 0.0]


def test_single_prompt_streams_text_and_stats(ckpt, capsys, tmp_path):
    code, out, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompt", "def add(a,", "--max-new-tokens", 12, *RPT,
                         "--ignore-eos")
    assert code == 0, err
    assert out.endswith("\n") and len(out) > 1
    stats = [line for line in err.splitlines() if line.startswith("stats:")]
    assert len(stats) == 1 and "12 new tokens" in stats[0] and "tokens/s" in stats[0]
    assert "model calls per token" in stats[0] and "corrections" in stats[0]
    # the streamed text is the JSON completion of the same prompt
    src = write_prompts(tmp_path / "one.jsonl", [{"prompt": "def add(a,"}, {"prompt": "x"}])
    code, _, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src, "--output", tmp_path / "o.jsonl",
                       "--max-new-tokens", 12, *RPT, "--ignore-eos", "--batch-size", 1)
    assert code == 0, err
    assert read_jsonl(tmp_path / "o.jsonl")[0]["completion"] == out[:-1]


def test_jsonl_in_order_batched_and_reference_agrees(ckpt, capsys, tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    outs = {}
    for name, extra in (("fast", []), ("ref", ["--reference"])):
        dst = tmp_path / f"{name}.jsonl"
        code, out, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src, "--output", dst,
                             "--batch-size", 2, "--max-new-tokens", 10, *RPT, "--ignore-eos", *extra)
        assert code == 0, err
        assert out == "" and "stats:" in err
        outs[name] = read_jsonl(dst)
        assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # written through a temp file
    assert outs["fast"] == outs["ref"]
    assert [r["id"] for r in outs["fast"]] == ["a", 1, 7]
    assert [r["prompt"] for r in outs["fast"]] == [p["prompt"] for p in PROMPTS]
    assert all(r["new_tokens"] == 10 and r["finish_reason"] == "length" for r in outs["fast"])
    # without --output the records go to stdout, one JSON object per line
    code, out, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src, "--max-new-tokens", 10, *RPT,
                         "--ignore-eos")
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == outs["fast"]


def test_stop_string_and_eos(ckpt, capsys, tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", PROMPTS[:1])
    dst = tmp_path / "o.jsonl"
    common = ["--checkpoint", ckpt["rpt"], "--prompts", src, "--output", dst, "--max-new-tokens", 16, *RPT]
    assert run(capsys, *common, "--ignore-eos")[0] == 0
    free = read_jsonl(dst)[0]
    text = free["completion"]
    assert len(text) > 6
    stop = text[3:5]
    assert run(capsys, *common, "--ignore-eos", "--stop", stop)[0] == 0
    rec = read_jsonl(dst)[0]
    assert rec["finish_reason"] == "stop" and rec["completion"] == text[: text.find(stop)]
    # EOS: declare a token the model produces mid-way to be the end of sequence
    tokenizer = PreTrainedTokenizerFast.from_pretrained(ckpt["rpt"])
    model = RPTForCausalLM.from_pretrained(ckpt["rpt"]).eval()
    prompt = torch.tensor([tokenizer(PROMPTS[0]["prompt"])["input_ids"]])
    config = SamplingConfig(max_new_tokens=16, rpt_iters=2, rpt_window=3, confidence=0.0)
    gen = generate(model, prompt, config).generated(0)
    assert tokenizer.decode(gen) == text
    cut = next(i for i, t in enumerate(gen) if i >= 2 and t not in gen[:i])
    assert run(capsys, *common, "--eos-token-id", gen[cut])[0] == 0
    rec = read_jsonl(dst)[0]
    assert rec["finish_reason"] == "eos" and rec["new_tokens"] == cut + 1
    assert rec["completion"] == tokenizer.decode(gen[:cut + 1])


def test_seed_reproducible_and_plain_model_for_ntp(ckpt, capsys, tmp_path):
    src = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    results = {}
    for seed in (3, 3, 4):
        dst = tmp_path / f"s{seed}.jsonl"
        code, _, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src, "--output", dst, "--seed", seed,
                           "--temperature", 1.0, "--no-ptp-greedy", "--max-new-tokens", 12, *RPT)
        assert code == 0, err
        results.setdefault(seed, []).append(read_jsonl(dst))
    assert results[3][0] == results[3][1]
    assert results[3][0] != results[4][0]
    # a plain HF checkpoint samples with --rpt-iters 0, like the RPT checkpoint's NTP (row 0 aside)
    code, out, err = run(capsys, "--checkpoint", ckpt["plain"], "--prompt", "for i in", "--max-new-tokens", 8,
                         "--rpt-iters", 0, "--token-healing")
    assert code == 0, err
    assert "stats: 8 new tokens" in err


def bad(capsys, *argv):
    code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_bad_inputs_give_one_clear_error(ckpt, capsys, tmp_path):
    missing = tmp_path / "nope"
    assert "does not exist" in bad(capsys, "--checkpoint", missing, "--prompt", "x")
    msg = bad(capsys, "--checkpoint", ckpt["plain"], "--prompt", "x", "--rpt-iters", 1)
    assert "not an RPT checkpoint" in msg and "--rpt-iters 0" in msg
    assert "larger than the window 3" in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompt", "x", "--rpt-iters", 1,
                                             "--rpt-window", 4)
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 60
    assert "context is 256" in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompt", long_prompt)
    src = tmp_path / "broken.jsonl"
    src.write_text('{"prompt": "ok"}\n{"prompt": "bad" \n')
    assert "line 2" in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src)
    src.write_text('{"prompt": "ok"}\n\n{"text": "no prompt"}\n')
    assert "line 3" in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src)
    assert "--prompts" not in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompt", "x", "--temperature", -1)


# slow (10 s, a second interpreter loading torch): sample.py's decode and its one-line errors stay in the
# default suite in process, and as a subprocess through test_an_unreachable_hub_is_one_line
@pytest.mark.slow
def test_subprocess_smoke(ckpt, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    ok = subprocess.run([sys.executable, "sample.py", "--checkpoint", ckpt["rpt"], "--prompt", "def fib(n):",
                         "--max-new-tokens", "6", "--rpt-iters", "1", "--ignore-eos"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "stats: 6 new tokens" in ok.stderr and ok.stdout.strip()
    fail = subprocess.run([sys.executable, "sample.py", "--checkpoint", str(tmp_path / "missing"), "--prompt", "x"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert fail.returncode == 2 and fail.stderr.strip().startswith("error:")
    assert "Traceback" not in fail.stderr and len(fail.stderr.strip().splitlines()) == 1


def test_token_healing_with_rpt(ckpt, capsys, tmp_path):
    """Healed prompts: both decoders agree, the first tokens re-spell the removed bytes, RPT never
    rewrites them (they are frozen), and the completion continues the prompt text."""
    from rpt.sampling.reference import generate_reference
    from rpt.sampling.text.healing import TokenVocabulary

    tokenizer = PreTrainedTokenizerFast.from_pretrained(ckpt["rpt"])
    model = RPTForCausalLM.from_pretrained(ckpt["rpt"]).eval()
    texts = ["def fib(n", "The quick brown ", "for i in range(10):\n    "]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(r):], mask[b, width - len(r):] = torch.tensor(r), 1
    config = SamplingConfig(max_new_tokens=10, rpt_iters=2, rpt_window=3, confidence=0.0, token_healing=True)
    fast = generate(model, ids, config, mask, tokenizer=tokenizer)
    ref = generate_reference(model, ids, config, mask, tokenizer=tokenizer)
    assert torch.equal(fast.sequences, ref.sequences) and fast.stats["corrections"] == ref.stats["corrections"]
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    assert sum(1 for p in fast.healing_prefixes if p) >= 2
    for b, prefix in enumerate(fast.healing_prefixes):
        assert vocab.decode(fast.generated(b)).startswith(prefix)
        healed = fast.sequences[b, fast.prompt_width - fast.prompt_lengths[b]: fast.prompt_width].tolist()
        assert tokenizer.decode(healed + fast.generated(b)).startswith(texts[b])
    src = write_prompts(tmp_path / "p.jsonl", [{"prompt": t} for t in texts])
    for extra in ([], ["--reference"]):
        code, out, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src, "--max-new-tokens", 10, *RPT,
                             "--token-healing", "--ignore-eos", *extra)
        assert code == 0, err
        recs = [json.loads(line) for line in out.splitlines()]
        for b, rec in enumerate(recs):
            healed = fast.sequences[b, fast.prompt_width - fast.prompt_lengths[b]: fast.prompt_width].tolist()
            full = tokenizer.decode(healed + fast.generated(b))
            assert rec["prompt"] + rec["completion"] == full


def test_texts_do_not_depend_on_batch_size_and_repeats_differ(ckpt, capsys, tmp_path):
    """Prompt i's draws are keyed by row_seed(seed, i): its sampled text is the same at any batch size, the
    reference sampler agrees, and repeated prompts (n samples of one task) differ."""
    from rpt.evaluation.batched_generation import generate_texts

    tokenizer = PreTrainedTokenizerFast.from_pretrained(ckpt["rpt"])
    model = RPTForCausalLM.from_pretrained(ckpt["rpt"]).eval()
    cfg = SamplingConfig(max_new_tokens=8, rpt_iters=1, rpt_window=3, confidence=0.1, temperature=1.0, seed=5)
    prompts = ["def fib(n):", "The quick brown", "for i in", "def fib(n):", "def fib(n):"]
    one = generate_texts(model, tokenizer, prompts, cfg, batch_size=1)
    three = generate_texts(model, tokenizer, prompts, cfg, batch_size=3)
    assert [o["text"] for o in one] == [o["text"] for o in three]
    assert [o["seed"] for o in one] == [row_seed(5, i) for i in range(5)]
    assert len({one[i]["text"] for i in (0, 3, 4)}) > 1
    src = write_prompts(tmp_path / "p.jsonl", [{"prompt": p} for p in prompts])
    args = ["--checkpoint", ckpt["rpt"], "--prompts", src, "--max-new-tokens", 8, "--rpt-iters", 1, "--rpt-window", 3,
            "--confidence", 0.1, "--temperature", 1.0, "--seed", 5, "--ignore-eos"]
    for extra in (["--batch-size", 2], ["--reference"]):
        code, out, err = run(capsys, *args, *extra)
        assert code == 0, err
        recs = [json.loads(line) for line in out.splitlines()]
        assert [r["completion"] for r in recs] == [o["text"] for o in one]
        assert f"stats: {sum(r['new_tokens'] for r in recs)} new tokens" in err  # each batch counted once
    code, _, err = run(capsys, *args, "--compile", "--reference")
    assert code == 2 and "--compile" in err


@pytest.mark.slow
def test_compile_flag_gives_the_eager_text(ckpt, capsys, tmp_path):
    """``--compile`` (inductor; minutes on 2 cores): the same completions as the eager decoder."""
    torch._dynamo.reset()
    src = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    outs = []
    for extra in ([], ["--compile"]):
        code, out, err = run(capsys, "--checkpoint", ckpt["rpt"], "--prompts", src, "--max-new-tokens", 6, *RPT,
                             "--ignore-eos", *extra)
        assert code == 0, err
        outs.append([json.loads(line)["completion"] for line in out.splitlines()])
    assert outs[0] == outs[1]


def test_output_path_checked_before_any_work(ckpt, capsys, tmp_path, monkeypatch):
    """An --output that cannot be written is one line before a model loads or a token is generated."""
    def no_work(*a, **k):
        raise AssertionError("the model loaded before the --output check")

    monkeypatch.setattr("rpt.sampling.loading.load_model", no_work)
    assert "does not exist" in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompt", "x", "--output",
                                   tmp_path / "out" / "x.jsonl")
    assert "is a directory" in bad(capsys, "--checkpoint", ckpt["rpt"], "--prompt", "x", "--output", tmp_path)
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == []  # nothing half-written


@pytest.mark.parametrize("ref, expect", [
    ("not-a-model-rpt-test", ["hub model id", "not in the local hub cache", "HF_HUB_OFFLINE", "hf download"]),
    ("rpt-test-org/not-a-model", ["no local directory", "hub model id", "hf download"]),
    ("runs/none/final", ["does not exist"]),
    ("bad id with spaces", ["neither an existing directory nor a valid hub id"]),
])
def test_a_model_reference_is_a_directory_or_a_cached_hub_id(capsys, monkeypatch, ref, expect):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = bad(capsys, "--checkpoint", ref, "--prompt", "x")
    assert all(e in msg for e in expect), msg
    assert "Repo id must be" not in msg


def test_an_unreachable_hub_is_one_line(tmp_path):
    # A closed local port as the hub: "online" but nothing answers (the test never touches the network).
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0",
               HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_ETAG_TIMEOUT="2")
    res = subprocess.run([sys.executable, "sample.py", "--checkpoint", "rpt-test-org/not-a-model", "--prompt", "x"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert "cannot be reached" in lines[0] and "hf download" in lines[0]


def test_help_loads_neither_torch_nor_transformers():
    code = "import sys, runpy; sys.argv = ['sample.py', '--help']\ntry:\n    runpy.run_path('sample.py', run_name='__main__')\n" \
           "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"
    assert "--output" in res.stdout
