r"""Weights stacked for the decode's fused projections: the decoder's own copy, refilled from the model.

A Llama layer's q, k and v projections read the same input, as do its MLP's gate and up projections:
one GEMM against the stacked ``[Wq; Wk; Wv]`` reads the weights in one pass, where three GEMMs (k and
v 2 MB GEMVs on a 1B model) each pay a launch and never reach the memory bandwidth. The stacked
matrix is a **second copy** that :class:`FusedGroup` allocates and owns: the model's parameters are
only read, never written, never given other storage, so a tensor a user holds (a ``state_dict``
snapshot, an EMA backup, the tensors ``load_state_dict(assign=True)`` took) stays what it was, and
nothing of the model shares storage with anything it did not share it with before.

**Staleness.** The copy is refilled (:meth:`FusedGroup.refresh`):

* whenever a cheap fingerprint of its sources changed (:meth:`FusedGroup.fingerprint`: each source
  parameter's identity, data address, ``_version``, dtype, device and shape) -- an optimizer step or
  any in-place write through the parameter bumps ``_version``; ``load_state_dict(assign=True)``,
  ``p.data = t``, ``.to(...)`` / ``.half()`` change the identity or the address;
* and unconditionally once per decode (``force``), because an in-place write through ``p.data``
  (PEFT's unsafe merge ``weight.data += delta``, ``torch_ema``'s ``param.data.copy_``) bumps the
  version counter of a temporary alias, not the parameter's: no fingerprint sees it, so a decode
  never trusts one for values. The refill reads the sources once and writes the copy once.

A refill writes into the copy's own storage while its shape, dtype and device fit (compiled steps and
CUDA graphs keep their input address), else allocates a new one. **Cost**: the bytes of the stacked
weights -- for a Llama-shaped model q, k, v, gate and up, about half of its parameters (Llama-3.2-1B:
637.5M of 1.24B parameters, 1.27 GB in bfloat16) -- allocated at the first fused decode and held
until :func:`rpt.decode_forward.llama_forward.release_fused_weights` or the model's collection; plus one
read and one write of them per decode.

A parameter that is not a plain dense tensor (a ZeRO-3 placeholder, a meta tensor, a tensor subclass
such as a DTensor shard) is never stacked: :meth:`FusedGroup.stackable` refuses, and the decode
keeps Hugging Face's forward.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class FusedGroup:
    """Parameters ``module.<name>`` of several modules stacked along dim 0 in :attr:`tensor`, a copy the
    group owns (module docstring)."""

    def __init__(self, slots: list[tuple[nn.Module, str]]):
        self.slots = slots
        self.tensor: torch.Tensor | None = None
        self.sizes: list[int] = []  # each source's rows in :attr:`tensor`, as filled
        self._fingerprint: tuple | None = None
        self._sources: list = []  # weak references to the parameters it was filled from (ids may be reused)

    def parameters(self) -> list:
        return [module._parameters.get(name) for module, name in self.slots]

    def fingerprint(self) -> tuple:
        """What a change of a source is seen by, without reading its values (module docstring); the sources'
        identities are checked apart (:meth:`current`)."""
        return tuple(None if p is None else (p.data_ptr(), p._version, p.dtype, p.device, tuple(p.shape))
                     for p in self.parameters())

    def current(self) -> bool:
        """Whether the copy was filled from the sources as they are now (by their identity and fingerprint)."""
        return (self.tensor is not None and all(ref() is p for ref, p in zip(self._sources, self.parameters()))
                and self._fingerprint == self.fingerprint())

    def stackable(self) -> bool:
        """Whether the sources can be stacked: plain dense tensors of one dtype, device and row shape."""
        params = self.parameters()
        first = params[0]
        if not isinstance(first, torch.Tensor):
            return False
        return all(isinstance(p, nn.Parameter) and type(p.data) is torch.Tensor and not p.is_meta and p.numel() > 0
                   and not hasattr(p, "ds_id") and p.dtype == first.dtype and p.device == first.device
                   and p.shape[1:] == first.shape[1:] for p in params)

    def refresh(self, force: bool = False) -> bool:
        """Fill the copy from the sources where their fingerprint changed (every time with ``force``); False
        (nothing changed) where they cannot be stacked. Only the group's own storage is written."""
        if not force and self.current():
            return True
        if not self.stackable():
            return False
        params = self.parameters()
        shape = (sum(p.shape[0] for p in params), *params[0].shape[1:])
        old = self.tensor
        # outside inference mode (a decode runs in it): an inference tensor could not be refilled later by a
        # call made outside it (ModelQueries under no_grad)
        with torch.inference_mode(False), torch.no_grad():
            if old is not None and old.shape == shape and old.dtype == params[0].dtype and old.device == params[0].device:
                torch.cat([p.detach() for p in params], out=old)  # the same address: graphs keep their input
                fused = old
            else:
                fused = torch.cat([p.detach() for p in params])
        if fused is not old and not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(fused)  # a fixed address: graph replay reads it in place
        self.tensor, self.sizes = fused, [p.shape[0] for p in params]
        self._sources = [weakref.ref(p) for p in params]
        self._fingerprint = self.fingerprint()
        return True
