r"""Weights stacked for the decode's fused projections, the model's parameters being views of them.

A Llama layer's q, k and v projections read the same input, as do its MLP's gate and up projections:
one GEMM against the stacked ``[Wq; Wk; Wv]`` reads the weights in one pass, where three GEMMs (k and
v 2 MB GEMVs on a 1B model) each pay a launch and never reach the memory bandwidth. The stacked matrix
is not a second copy: :class:`FusedGroup` allocates it, copies the parameters in, and makes each
parameter's ``.data`` its block of rows. Everything else keeps working on the parameters themselves --
their names, ``state_dict``, PEFT targets, gradients, optimizers -- and an in-place write to a
parameter (an optimizer step, ``load_state_dict``'s copy, ``p.mul_(...)``) is a write to the stacked
matrix: the next decode sees it with nothing to rebuild.

What breaks the sharing is a parameter getting other storage: ``module.weight = nn.Parameter(...)``,
``p.data = t``, ``load_state_dict(assign=True)``, ``model.to(dtype or device)``. So a group is keyed
on storage, not on values: :meth:`FusedGroup.current` checks that every module still holds the same
parameter at its block's address (the decode checks before its first model call), and
:meth:`FusedGroup.bind` stacks the parameters again -- into the same matrix while its shape, dtype and
device fit, so compiled steps and CUDA graphs keep their input; otherwise into a new one.

A parameter whose storage is not its own (a view into FSDP's or ZeRO's flat parameter, a meta tensor,
a tensor subclass) is never taken over: :meth:`FusedGroup.bind` refuses, and the decode keeps Hugging
Face's forward.
"""

from __future__ import annotations

import torch
from torch import nn


def _storage_is_own(p: torch.Tensor) -> bool:
    """Whether ``p`` is the whole of its storage (nothing else can be reading or writing it through it)."""
    return p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.numel() * p.element_size()


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class FusedGroup:
    """Parameters ``module.<name>`` of several modules stacked along dim 0 in :attr:`tensor`, each one's
    data its block of rows (module docstring)."""

    def __init__(self, slots: list[tuple[nn.Module, str]]):
        self.slots = slots
        self.tensor: torch.Tensor | None = None
        self._bound: list[tuple[dict, str, nn.Parameter, int]] = []  # (module._parameters, name, param, address)

    def parameters(self) -> list:
        return [module._parameters.get(name) for module, name in self.slots]

    def current(self) -> bool:
        """Whether every module holds the parameter bound to it, still at its block of :attr:`tensor`."""
        for table, name, param, address in self._bound:
            p = table.get(name)
            if p is not param or p.data_ptr() != address:
                return False
        return bool(self._bound)

    def _stackable(self, params: list) -> bool:
        first = params[0]
        if not isinstance(first, nn.Parameter):
            return False
        for p in params:
            if (not isinstance(p, nn.Parameter) or type(p.data) is not torch.Tensor or p.is_meta or p.numel() == 0
                    or hasattr(p, "ds_id") or p.dtype != first.dtype or p.device != first.device
                    or p.shape[1:] != first.shape[1:] or not p.is_contiguous()):
                return False
            # a parameter in other storage (a sharded flat parameter) must not be moved out of it
            if not (_storage_is_own(p) or (self.tensor is not None and _same_storage(p, self.tensor))):
                return False
        return len({id(p) for p in params}) == len(params)

    def bind(self) -> bool:
        """Stack the parameters' current values into the group's matrix and make each one's data its block;
        False (nothing changed) where one of them cannot be taken over."""
        params = self.parameters()
        if not params or not self._stackable(params):
            return False
        sizes = [p.shape[0] for p in params]
        shape = (sum(sizes), *params[0].shape[1:])
        old = self.tensor
        blocks = None
        if old is not None and old.shape == shape and old.dtype == params[0].dtype and old.device == params[0].device:
            blocks = old.split(sizes)
            # a parameter elsewhere in the old matrix than its block: copying in place could overwrite it
            if any(_same_storage(p, old) and p.data_ptr() != b.data_ptr() for p, b in zip(params, blocks)):
                blocks = None
        # built outside inference mode (a decode runs in it): the parameters stay normal tensors that
        # autograd can train after the decode
        with torch.inference_mode(False), torch.no_grad():
            if blocks is None:
                fused = torch.cat([p.detach() for p in params])
                blocks = fused.split(sizes)
            else:
                fused = old
                for p, block in zip(params, blocks):
                    if p.data_ptr() != block.data_ptr():
                        block.copy_(p.detach())
            for p, block in zip(params, blocks):
                if p.data_ptr() != block.data_ptr():
                    p.data = block  # the same Parameter object (names, optimizers, hooks), the matrix's storage
        if fused is not old and not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(fused)  # a fixed address: graph replay reads it in place
        self.tensor = fused
        self._bound = [(module._parameters, name, p, p.data_ptr()) for (module, name), p in zip(self.slots, params)]
        return True
