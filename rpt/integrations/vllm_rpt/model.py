"""``RPTLlamaForCausalLM``: vLLM's Llama (and the Llama-shaped Qwen2/3, Mistral checkpoints it loads)
plus the RPT checkpoint's offset table, selected by ``hf_overrides={"architectures":
["RPTLlamaForCausalLM"]}`` for an unchanged checkpoint.

Ids carry the chain codes of :mod:`.codes`: a row's embedding is ``E[id mod V] + table[offset row of
its code]`` and its rotary position ``slot - shift[code]`` (plain rows: code 0, unchanged); the chain
rows' attention is redone under RPT's rule (:mod:`.side_attention`). The table is read through the
project's own readers (``rpt_config.json``, ``rpt_table/offset_embedding.safetensors``) after the
weights; a checkpoint without one serves plain requests only.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

from rpt.checkpoint.folded_weights import FORMAT_FOLDED
from rpt.checkpoint.rpt_config import TABLE_KEY, read_offset_table, read_rpt_config
from rpt.integrations.vllm_rpt.codes import code_tables
from rpt.integrations.vllm_rpt.internals import check_version
from rpt.integrations.vllm_rpt.side_attention import (
    chains_of_step,
    current_chains,
    find_chains,
    redo_chain_rows,
)


class RPTLlamaAttention(LlamaAttention):
    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v)
        chains = current_chains()
        if chains:
            out = redo_chain_rows(self.attn, q, k, v, out, chains)
        output, _ = self.o_proj(out)
        return output


class RPTLlamaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        super().__init__(vllm_config, prefix=prefix, config=config, attn_layer_type=RPTLlamaAttention)


class RPTLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        check_version()
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=RPTLlamaDecoderLayer)
        model_config = vllm_config.model_config
        self.rpt_source = model_config.model
        self.rpt_lookup = {"revision": model_config.revision} if model_config.revision else {}
        self.rpt_window: int | None = None  # the trained window; None: no offset table
        self.rpt_rows: torch.Tensor | None = None  # [codes, hidden]: the offset row each code adds
        self.rpt_shift: torch.Tensor | None = None  # [codes]: slot - true position

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        config = read_rpt_config(self.rpt_source, **self.rpt_lookup)
        if config is None:
            return loaded
        if config.format_version != FORMAT_FOLDED:
            raise ValueError(f"{config.path} is format version {config.format_version}: vLLM loads the NTP row folded "
                             "into the embedding (version 2); re-save it with RPTForCausalLM.save_pretrained")
        embed = self.model.embed_tokens.weight
        table = read_offset_table(self.rpt_source, config, embed.shape[1], **self.rpt_lookup)[TABLE_KEY]
        offset, shift, _ = code_tables(config.window)
        self.rpt_rows = table.to(device=embed.device, dtype=embed.dtype)[offset]
        self.rpt_shift = shift.to(embed.device)
        self.rpt_window = config.window
        return loaded

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None):
        vocab = self.config.vocab_size
        if self.rpt_rows is None or input_ids is None or inputs_embeds is not None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        # vLLM pads a new one-token request's drafts with -1: code 0 there, as in the stock model
        codes = torch.div(input_ids.clamp(min=0), vocab, rounding_mode="floor")
        if not bool(codes.any()):
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        embeds = self.model.embed_input_ids(input_ids - codes * vocab) + self.rpt_rows[codes]
        true_positions = positions - self.rpt_shift[codes]
        from vllm.forward_context import get_forward_context  # late: only a step with chains needs it

        metadata = get_forward_context().attn_metadata
        metadata = metadata[0] if isinstance(metadata, list) else metadata
        first = next(iter(metadata.values())) if isinstance(metadata, dict) else metadata
        chains = find_chains(codes, true_positions, first.query_start_loc)
        with chains_of_step(chains):
            return self.model(None, true_positions, intermediate_tensors, embeds)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        # callers outside forward (never with chain codes in this engine) see plain token ids
        return self.model.embed_input_ids(input_ids % self.config.vocab_size)
