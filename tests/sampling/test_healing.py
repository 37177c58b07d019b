"""Token healing with a byte-level BPE tokenizer trained here on a small text."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LogitsProcessorList, PreTrainedTokenizerFast

from rpt.sampling import TokenHealingLogitsProcessor, TokenVocabulary, heal_prompt, heal_prompts
from tests.helpers.tiny_models import tiny_llama

CORPUS = '''def add(x, y):
    return x + y

def hello_world():
    print("hello world")
    return None

class Greeter:
    def greet(self, name):
        if name:
            return "hello " + name
        return "hello world"
''' * 20 + "The quick brown fox jumps over the lazy dog. Hello world, hello there. Héllo wörld.\n" * 20

# (prompt, a natural continuation): ends in a space, in newline + indentation, mid-word
CASES = [
    ("def hello_world():\n    print(\"hello ", "world\")"),
    ("def add(x, y):\n    ", "return x + y"),
    ("class Greeter:\n    def gre", "et(self, name):"),
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([CORPUS], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def vocab(tok) -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(tok)


def test_byte_table_round_trips(tok, vocab):
    assert vocab.bytes[tok.eos_token_id] is None
    for text in ["def add(x, y):\n    return x", "Héllo wörld — 日本語 ✓", "\t\r\n  x"]:
        ids = tok(text)["input_ids"]
        assert vocab.decode(ids) == text.encode()
    assert vocab.decode([tok.eos_token_id]) is None


def test_consistent_with_equals_brute_force(vocab):
    for rest in [b" ", b"\n    ", b"\n", b"wor", b"he", b"\xc3", b"\xff", b"zzz", b"    return"]:
        want = {i for i, b in enumerate(vocab.bytes) if b and (b.startswith(rest) or rest.startswith(b))}
        assert set(vocab.consistent_with(rest).tolist()) == want, rest
        longer = any(b and b.startswith(rest) and len(b) > len(rest) for b in vocab.bytes)
        assert vocab.has_longer_token(rest) == longer


@pytest.mark.parametrize("prompt,continuation", CASES)
def test_without_healing_the_prompt_tokens_are_not_canonical(tok, vocab, prompt, continuation):
    """The failure healing fixes: the prompt's own tokens are not how the full text is tokenized."""
    plain, full = tok(prompt)["input_ids"], tok(prompt + continuation)["input_ids"]
    assert full[: len(plain)] != plain
    healed = heal_prompt(vocab, plain)
    # after backing up, the kept tokens are a prefix of the canonical tokens, and nothing is lost
    assert full[: len(healed.input_ids)] == healed.input_ids
    assert healed.removed_tokens >= 1 and vocab.decode(healed.input_ids) + healed.prefix == prompt.encode()


def test_heal_prompt_edges(tok, vocab):
    ids = tok("def add(x, y):\n    ")["input_ids"]
    assert heal_prompt(vocab, ids, max_backup_tokens=0).input_ids == ids
    assert heal_prompt(vocab, ids).prefix == b"\n    "
    eos = tok.eos_token_id
    one = tok(" ")["input_ids"]
    assert heal_prompt(vocab, [eos, *one]).input_ids == [eos]  # a special token is never removed
    assert heal_prompt(vocab, one).input_ids == one  # at least one token is kept
    with pytest.raises(ValueError, match="max_backup_tokens"):
        heal_prompt(vocab, ids, max_backup_tokens=-1)


class CanonicalOracle:
    """A 'model' that has only seen canonical tokenizations of ``targets`` (weight = preference).

    Given a prefix of some target's canonical ids it prefers that target's next token; off every
    target (a non-canonical prefix) it knows nothing and prefers EOS.
    """

    def __init__(self, tok, targets: dict[str, float]):
        self.eos, self.width = tok.eos_token_id, len(tok)
        self.targets = [(tok(t)["input_ids"], w) for t, w in targets.items()]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(ids.shape[0], self.width)
        logits[:, self.eos] = 1.0
        for r, row in enumerate(ids.tolist()):
            for target, weight in self.targets:
                if target[: len(row)] == row and len(row) < len(target):
                    logits[r, target[len(row)]] += weight
        return logits


def greedy(model, ids: list[int], processors: LogitsProcessorList, eos: int, steps: int = 40) -> list[int]:
    x = torch.tensor([ids])
    for _ in range(steps):
        nxt = processors(x, model(x)).argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
        if nxt.item() == eos:
            break
    return x[0].tolist()


@pytest.mark.parametrize("prompt,continuation", CASES)
def test_healing_recovers_the_canonical_continuation(tok, vocab, prompt, continuation):
    target = prompt + continuation
    # The oracle likes `target` (weight 5) but likes a text that drops the prompt's tail even more.
    kept_text = tok.decode(heal_prompt(vocab, tok(prompt)["input_ids"]).input_ids)
    decoy = kept_text + "The quick brown fox"
    oracle = CanonicalOracle(tok, {target: 5.0, decoy: 10.0})
    none = LogitsProcessorList()
    eos = tok.eos_token_id

    # 1. no healing: the prompt's non-canonical tail leaves the model lost (it stops at once)
    out = greedy(oracle, tok(prompt)["input_ids"], none, eos)
    assert tok.decode(out, skip_special_tokens=True) == prompt
    # 2. backing up without the constraint: the output no longer starts with the prompt
    (healed,), _ = heal_prompts(tok, [prompt], vocab=vocab)
    out = greedy(oracle, healed.input_ids, none, eos)
    assert not tok.decode(out, skip_special_tokens=True).startswith(prompt)
    # 3. healing: the canonical tokens of the whole text, which starts with the prompt
    heal = TokenHealingLogitsProcessor(vocab, [healed.prefix], prompt_length=len(healed.input_ids))
    out = greedy(oracle, healed.input_ids, LogitsProcessorList([heal]), eos)
    assert out[:-1] == tok(target)["input_ids"]
    assert tok.decode(out, skip_special_tokens=True) == target


def test_processor_masks_statelessly(tok, vocab):
    prefixes = [b"\n    ", b"", b"wor"]
    base = [tok("x")["input_ids"]] * 3
    heal = TokenHealingLogitsProcessor(vocab, prefixes, prompt_length=1)
    scores = torch.zeros(3, len(tok))
    got = heal(torch.tensor(base), scores)
    for r, prefix in enumerate(prefixes):
        allowed = set(torch.isfinite(got[r]).nonzero().flatten().tolist())
        want = set(vocab.consistent_with(prefix).tolist()) if prefix else set(range(len(tok)))
        assert allowed == want
    # after a generated "\n" only tokens continuing "    " remain for row 0; row 2 is free after "world"
    nl, world = tok("\n")["input_ids"], tok("world")["input_ids"]
    assert len(nl) == 1 and len(world) == 1
    ids = torch.tensor([[base[0][0], nl[0]], [base[0][0], nl[0]], [base[0][0], world[0]]])
    got = heal(ids, scores)
    assert set(torch.isfinite(got[0]).nonzero().flatten().tolist()) == set(vocab.consistent_with(b"    ").tolist())
    assert torch.isfinite(got[1:]).all()
    # once every prefix is spelled, the scores pass through untouched
    assert heal(torch.zeros(3, 1 + 5, dtype=torch.long), scores) is scores
    with pytest.raises(ValueError, match="prefixes"):
        heal(torch.zeros(2, 2, dtype=torch.long), scores[:2])


def test_healing_inside_hf_generate(tok, vocab):
    """A random model, left-padded batch, greedy and sampled: the text always starts with the prompt."""
    model = tiny_llama(vocab_size=len(tok), seed=3)
    model.generation_config.eos_token_id = tok.eos_token_id
    prompts = [p for p, _ in CASES]
    healed, _ = heal_prompts(tok, prompts, vocab=vocab)
    width = max(len(h.input_ids) for h in healed)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(h.input_ids)) + h.input_ids for h in healed])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(h.input_ids) for h in healed])[:, None]).long()
    heal = TokenHealingLogitsProcessor(vocab, [h.prefix for h in healed], prompt_length=width)
    starts = []
    for seed in range(3):
        torch.manual_seed(seed)
        kw = dict(attention_mask=mask, max_new_tokens=8, pad_token_id=tok.pad_token_id, do_sample=seed > 0)
        out = model.generate(ids, logits_processor=LogitsProcessorList([heal]), **kw)
        for row, prompt in zip(tok.batch_decode(out, skip_special_tokens=True), prompts):
            assert row.startswith(prompt)
        torch.manual_seed(seed)
        bare = model.generate(ids, **kw)
        starts += [row.startswith(p) for row, p in zip(tok.batch_decode(bare, skip_special_tokens=True), prompts)]
    assert not all(starts)  # without the constraint a random model drifts off the prompt


def test_matches_llguidance_when_installed(tok, vocab):
    llguidance_hf = pytest.importorskip("llguidance.hf")
    ll = llguidance_hf.from_tokenizer(tok)
    for i, b in enumerate(vocab.bytes):
        if b == b"\xff":  # llguidance reserves the byte 0xff to mark special tokens
            continue
        assert (b or b"") == (b"" if ll.is_special_token(i) else ll.decode_bytes([i])), i
    for prompt, _ in CASES:
        _, leftover = ll.tokenize_partial(prompt.encode())
        assert heal_prompt(vocab, tok(prompt)["input_ids"]).prefix == leftover


def test_unspellable_rest_leaves_the_row_free():
    vocab = TokenVocabulary([None, b"a", b"ab"])  # nothing can spell the "c" of "ac"
    heal = TokenHealingLogitsProcessor(vocab, [b"ac"], prompt_length=1)
    scores = torch.zeros(1, 3)
    first = heal(torch.tensor([[0]]), scores)
    assert torch.isfinite(first).tolist() == [[False, True, False]]  # only "a" keeps "ac" reachable
    assert torch.isfinite(heal(torch.tensor([[0, 1]]), scores)).all()
