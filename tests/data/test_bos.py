"""Documents are packed as the model's tokenizer encodes a text: with its BOS when it prepends one
(Llama-3 style, as sample.py's prompts get it), without one otherwise -- in a token store and in
a stream alike."""

import json

import pytest
from tokenizers import processors

from rpt.data import TokenStore, build_packed, write_token_store
from rpt.data.tokenizer import bos_id
from rpt.training.config import TrainConfig
from tests.helpers.tiny_models import tiny_tokenizer

TEXTS = ["def f(x):\n    return x\n", "print('hello')\n", "x = 1 + 2\n"]


def llama3_style():
    """The tiny tokenizer with a BOS token its post-processor prepends, as Llama-3's does."""
    tok = tiny_tokenizer()
    tok.add_special_tokens({"bos_token": "<|begin_of_text|>"})
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    return tok


@pytest.mark.parametrize("make", [llama3_style, tiny_tokenizer])
def test_store_and_stream_pack_documents_as_the_tokenizer_encodes_them(tmp_path, make):
    tok = make()
    # the independent truth: the tokenizer's own encoding of each text, then EOS
    expected = [i for t in TEXTS for i in tok(t)["input_ids"] + [tok.eos_token_id]]
    assert (expected[0] == tok.bos_token_id) == (make is llama3_style)
    write_token_store(str(tmp_path / "store"), TEXTS, tok, progress=False)
    store = TokenStore(str(tmp_path / "store"))
    assert store.read(0, store.num_tokens).tolist() == expected
    assert store.meta["bos_id"] == bos_id(tok)

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    cfg = TrainConfig(model={"model_type": "llama"}, data={"path": str(corpus), "streaming": True}, val_fraction=0.0,
                      seq_len=len(expected) - 1, micro_batch_size=1, shuffle_buffer=0, data_workers=0)
    assert build_packed(cfg, "train", tok).micro_batch(1, 0)[0].tolist() == expected


def test_a_store_written_without_bos_is_refused_for_a_bos_tokenizer(tmp_path):
    """A store from before BOS was packed (no bos_id in its index) and a BOS-prepending tokenizer."""
    from rpt.errors import DataError

    tok = llama3_style()
    write_token_store(str(tmp_path / "store"), TEXTS, tok, progress=False)
    index = tmp_path / "store" / "index.json"
    meta = json.loads(index.read_text())
    del meta["bos_id"]
    index.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="prepare the store again"):
        TokenStore(str(tmp_path / "store")).check_tokenizer(tok)
