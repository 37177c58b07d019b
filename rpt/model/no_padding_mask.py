"""An all-ones attention mask that transformers drops without reading the device.

``RPTForCausalLM`` passes an explicit all-ones mask with permuted ``position_ids``: without one,
transformers reads every position jump as the start of a packed document and cuts attention there
(docs/design.md). transformers then checks the mask for padding on the device (``masking_utils``'
``fast_all``, a host sync on every forward) only to find none and drop it (sdpa's ``is_causal``,
flash's causal kernel). :func:`no_padding_mask` builds the mask marked as all ones, and the mask
builders transformers dispatches to are wrapped (once, through its ``AttentionMaskInterface``) so that
a marked mask is handled as the no-padding mask it is, with nothing read: each builder is called with
``attention_mask=None`` -- after transformers has seen a mask, so the packed-document reading of the
positions is already off. Any other mask reaches the builders unchanged.
"""

from __future__ import annotations

import functools

import torch

_MARK = "rpt_all_ones"


def _ignoring_marked_masks(build):
    @functools.wraps(build)
    def builder(*args, attention_mask=None, **kwargs):
        if getattr(attention_mask, _MARK, False):
            attention_mask = None  # all ones by construction: no padding, and no need to read it to know
        return build(*args, attention_mask=attention_mask, **kwargs)

    builder.ignores_marked_masks = True
    return builder


@functools.cache
def _install() -> None:
    """Wrap every mask builder transformers has registered (sdpa, eager, flash, flex); one registered
    later is not wrapped and reads a marked mask as any other (correct, with its host sync)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    for name in list(ALL_MASK_ATTENTION_FUNCTIONS):
        build = ALL_MASK_ATTENTION_FUNCTIONS[name]
        if not getattr(build, "ignores_marked_masks", False):
            ALL_MASK_ATTENTION_FUNCTIONS[name] = _ignoring_marked_masks(build)


def no_padding_mask(shape: torch.Size | tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """A ``[batch, length]`` all-ones (bool) attention mask on ``device`` that transformers' mask builders
    take as "no padding" without reading it. Bool on the model's device, so transformers' ``.to(device,
    bool)`` returns this very tensor, mark included."""
    _install()
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    setattr(mask, _MARK, True)
    return mask
