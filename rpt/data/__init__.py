"""Training data: sources -> documents -> tokens -> fixed chunks of ``seq_len + 1`` tokens.

* :mod:`rpt.data.sources`     sources (stdlib, local files, hub, streamed or not) as sharded
                              document streams; the hash-based held-out split
* :mod:`rpt.data.tokenizer`   load / train a tokenizer; the one tokenisation function
* :mod:`rpt.data.token_store` the on-disk token store: parallel atomic writer, positional reader
* :mod:`rpt.data.order`       the seeded O(1)-memory permutation of chunks per epoch
* :mod:`rpt.data.packed`      chunks of a store by global sample index (map-style training)
* :mod:`rpt.data.rank_stream`   streamed training: per-rank packing in resumable DataLoader workers
* :mod:`rpt.data.run_data`       config -> the run's training and validation data
"""

from rpt.data.packed import PackedStore, StoreBatches
from rpt.data.run_data import build_packed, build_tokenizer, default_store_path, prepare_store, split_sources
from rpt.data.sources import stdlib_files, stdlib_texts
from rpt.data.token_store import TokenStore, write_token_store
from rpt.data.tokenizer import EOS_TOKEN, load_or_train_tokenizer, tokenizer_fingerprint, train_bpe_tokenizer
from rpt.errors import DataError

__all__ = [
    "EOS_TOKEN", "DataError", "PackedStore", "StoreBatches", "TokenStore", "build_packed", "build_tokenizer",
    "default_store_path",
    "load_or_train_tokenizer", "prepare_store", "split_sources", "stdlib_files", "stdlib_texts",
    "tokenizer_fingerprint", "train_bpe_tokenizer", "write_token_store",
]
