"""What a model reference names -- a local directory or a hub id, cached or not -- decided once,
before any work, for every entry point (``train.py``'s ``model`` / ``init_from`` / ``tokenizer``,
``sample.py`` and the evaluation scripts' ``--checkpoint``, ``merge_lora.py``, ``custom_generate``).

A reference that cannot load is one :class:`ModelRefError` naming it and the fix, instead of what
``from_pretrained`` says three frames deep: "Repo id must be in the form 'repo_name'" for a local
folder that does not exist, a missing-directory message for a bare hub id (``gpt2``), a 50-line
connection traceback offline.

* an existing directory: itself;
* a path (absolute, ``./``, ``~``, two or more ``/``, a trailing ``/``) that does not exist: an error;
* otherwise a hub id (``gpt2``, ``org/name``): fine when it is in the local hub cache; offline
  (``HF_HUB_OFFLINE=1``) and not cached, an error saying how to get it; online, the hub is asked
  once whether the model exists (an unreachable hub is an error, not a hang in a download).
"""

from __future__ import annotations

import os

from rpt.errors import ModelRefError

# Files one of which every model or tokenizer repository has: one of them cached = the repo was fetched.
CACHE_MARKERS = ("config.json", "tokenizer_config.json", "adapter_config.json", "tokenizer.json")
HUB_TIMEOUT_S = 10.0


def hub_offline() -> bool:
    from huggingface_hub import constants

    env = {os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return bool(constants.HF_HUB_OFFLINE) or bool(env & {"1", "ON", "YES", "TRUE"})


def looks_like_path(ref: str) -> bool:
    """Only a path could mean this (a hub id is ``name`` or ``org/name``)."""
    return (os.path.isabs(ref) or ref.startswith((".", "~")) or ref.count("/") > 1 or ref.endswith(("/", os.sep))
            or "\\" in ref)


def is_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in CACHE_MARKERS)


def _check_on_hub(ref: str, what: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(ref, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise ModelRefError(f"{what} {ref!r} is a gated hub model: accept its licence on the hub and log in "
                            "(`hf auth login`), or give a local directory") from None
    except RepositoryNotFoundError:
        raise ModelRefError(f"{what} {ref!r} is neither a local directory nor a model on the hub (or a private one: "
                            "log in with `hf auth login`); check the spelling or give a local directory") from None
    except Exception as e:  # connection refused, DNS, timeout, proxy: the hub is not reachable from here
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelRefError(f"{what} {ref!r} is a hub model id that is not cached here, and the hub cannot be "
                            f"reached ({reason[:160]}); download it where the hub is reachable (`hf download {ref}`) "
                            "and run with HF_HUB_OFFLINE=1, or give a local directory") from None


def resolve_model_ref(ref: str, what: str, missing_hint: str = "") -> str:
    """The directory (``~`` expanded) or hub id ``ref`` names, checked to be loadable; else
    :class:`ModelRefError`. ``what`` names the reference in the message (``config key 'init_from'``,
    ``--checkpoint``); ``missing_hint`` is the fix for a local path that does not exist."""
    if not isinstance(ref, str) or not ref.strip():
        raise ModelRefError(f"{what} must be a local directory or a hub model id, got {ref!r}")
    path = os.path.expanduser(ref)
    if os.path.isdir(path):
        return path
    hint = missing_hint or "check the path"
    if os.path.exists(path):
        raise ModelRefError(f"{what} {ref!r} is a file, not a model directory; give the directory that holds "
                            "config.json")
    if looks_like_path(ref):
        raise ModelRefError(f"{what} {ref!r} does not exist (no such directory); {hint}")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError:
        raise ModelRefError(f"{what} {ref!r} is neither an existing directory nor a valid hub id; {hint}") from None
    if is_cached(ref):
        return ref
    local = f"no local directory {ref!r} exists and " if "/" in ref else ""
    if hub_offline():
        raise ModelRefError(f"{what} {ref!r}: {local}as a hub model id it is not in the local hub cache, and "
                            "HF_HUB_OFFLINE=1 forbids downloading it; download it once where the hub is reachable "
                            f"(`hf download {ref}`), or unset HF_HUB_OFFLINE, or give a local directory"
                            + (f" ({hint})" if local else ""))
    _check_on_hub(ref, what)
    return ref
