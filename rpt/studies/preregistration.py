"""The two guards of a pre-registered study: its official run happens only on the registered protocol.

Both compare file *contents* (bytes read from disk and blobs read from git's object store, never
``git status``, which ``git update-index --assume-unchanged`` or ``--skip-worktree`` can blind) and
refuse with :class:`NotPreregistered` (one line).

**Against a named registration commit** (:func:`check_preregistered`; the agreement study). A
:class:`Registration` names the pre-registration document, the commit that registered it, and the
protocol files the run reads (configs). The check passes only when:

1. every file (document and protocol) in the working tree is byte-identical to its blob at ``HEAD``
   (an uncommitted or staged edit, hidden from ``git status`` or not, is refused);
2. the document at ``HEAD`` is byte-identical to the document at the registration commit (the
   registered text is never edited afterwards), and that commit is an ancestor of ``HEAD``;
3. every protocol file's *registered fields* are unchanged since the registration commit: for a YAML
   mapping, every key present at the registration commit (at any depth) has the same parsed value at
   ``HEAD`` (comments and formatting may change); a key *added* in a later commit is accepted and
   recorded in the returned record (``added_after_registration``), so the results say what was added;
   a removed key is a changed field. Any other file must be byte-identical to its registered blob.

**Before the official result** (:func:`check_before_result`; the scaling study). Each protocol file's
bytes, as they are in the work tree now, must be the file's content in some commit that is an ancestor
of HEAD (its *registration commit*: the first such commit), and every registration commit must precede
the first commit that added the official result (if one was committed): a protocol changed after the
result, or never committed, or edited in the work tree, is refused. The comparison is git's own blob
id (``git hash-object``), so line endings and every byte count.

Where the guarantee stops: a protocol file must be listed to be guarded (a ``base:`` chain's files
too), and code is guarded only by the commit the results record (:func:`code_commit`), not by a check.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class NotPreregistered(Exception):
    """The official run is refused; the message is the one line to show."""


@dataclass(frozen=True)
class Registration:
    document: str  # the pre-registration text, relative to the repository root
    commit: str  # the commit that registered it (full or abbreviated hash)
    protocol: tuple[str, ...] = ()  # the files the run reads whose registered content must hold
    fix: str = field(default="", compare=False)  # how to develop instead, appended to every refusal


def _git(root: Path, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=text)


def _blob(root: Path, commit: str, path: str) -> bytes | None:
    """``path``'s bytes at ``commit`` from the object store, or None when it is not there."""
    got = _git(root, "cat-file", "blob", f"{commit}:{path}", text=False)
    return got.stdout if got.returncode == 0 else None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def changed_fields(registered: Any, current: Any, prefix: str = "") -> tuple[list[str], dict[str, Any]]:
    """(the registered keys whose value changed or went, the keys added since) of two parsed YAML
    documents; dotted paths. A non-mapping is one field compared whole."""
    if not isinstance(registered, dict) or not isinstance(current, dict):
        return ([prefix or "(the whole file)"] if registered != current else []), {}
    changed, added = [], {}
    for key, value in registered.items():
        name = f"{prefix}{key}"
        if key not in current:
            changed.append(f"{name} (removed)")
            continue
        c, a = changed_fields(value, current[key], f"{name}.")
        changed += [x.rstrip(".") for x in c]
        added.update(a)
    added.update({f"{prefix}{k}": v for k, v in current.items() if k not in registered})
    return changed, added


def _protocol_changes(path: str, registered: bytes, current: bytes) -> tuple[list[str], dict[str, Any]]:
    if registered == current:
        return [], {}
    if not path.endswith((".yaml", ".yml")):
        return ["(the file's bytes)"], {}
    try:
        return changed_fields(yaml.safe_load(registered), yaml.safe_load(current))
    except yaml.YAMLError:
        return ["(the file no longer parses as YAML)"], {}


def check_preregistered(root: str | Path, registration: Registration) -> dict:
    """The record of a run on the registered protocol (the document's path, sha256 and registration
    commit, ``HEAD``, and per protocol file its sha256 and the keys added after the registration).
    Raises :class:`NotPreregistered` (one line) on any difference listed in the module's docstring."""
    root = Path(root)
    doc, commit = registration.document, registration.commit
    fix = f": {registration.fix}" if registration.fix else ""

    def refuse(why: str) -> NotPreregistered:
        return NotPreregistered(f"the official run needs the pre-registered {doc} (commit {commit[:12]}), and {why}{fix}")

    if shutil.which("git") is None:
        raise refuse("git is not installed")
    if _git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        raise refuse(f"{root} is not a git work tree")
    head = _git(root, "rev-parse", "--verify", "HEAD^{commit}").stdout.strip()
    full = _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").stdout.strip()
    if not full:
        raise refuse("the registration commit is not in this repository (a shallow clone? fetch its history)")
    if not head or _git(root, "merge-base", "--is-ancestor", full, head).returncode != 0:
        raise refuse(f"the registration commit is not an ancestor of HEAD ({head[:12] or 'no commits'})")
    files = {}
    for path in (doc, *registration.protocol):
        at_head = _blob(root, head, path)
        if at_head is None:
            raise refuse(f"{path} is not committed in HEAD")
        try:
            on_disk = (root / path).read_bytes()
        except OSError as e:
            raise refuse(f"{path} cannot be read ({e.strerror or e})") from None
        if on_disk != at_head:  # contents, not `git status`: an assume-unchanged edit is still an edit
            raise refuse(f"{path} differs from its committed version at HEAD (an uncommitted edit); "
                         f"restore it with `git checkout -- {path}`")
        registered = _blob(root, full, path)
        if registered is None:
            raise refuse(f"{path} was not part of the registration (absent at {commit[:12]})")
        files[path] = (registered, at_head)
    registered, at_head = files.pop(doc)
    if registered != at_head:
        raise refuse(f"{doc} was edited after the registration (sha256 {_sha(at_head)[:12]}, registered "
                     f"{_sha(registered)[:12]}); the registered text is never changed")
    protocol = {}
    for path, (reg, cur) in files.items():
        changed, added = _protocol_changes(path, reg, cur)
        if changed:
            raise refuse(f"{path} changed registered fields since the registration: {', '.join(changed)}")
        protocol[path] = {"sha256": _sha(cur), "registered_sha256": _sha(reg), "added_after_registration": added}
    return {"path": doc, "sha256": _sha(at_head), "commit": full, "head": head, "protocol": protocol}


# ---- before the official result -------------------------------------------------------------------
def _registration_commit(root: Path, path: str, fix: str) -> str:
    """The first commit in HEAD's history whose ``path`` has the work tree's bytes."""
    if not (root / path).is_file():
        raise NotPreregistered(f"{path} does not exist: {fix}")
    blob = _git(root, "hash-object", "--", path)
    if blob.returncode != 0:
        raise NotPreregistered(f"cannot read {path} with git ({blob.stderr.strip()}): {fix}")
    blob_id = blob.stdout.strip()
    history = _git(root, "log", "--format=%H", "--reverse", "--full-history", "HEAD", "--", path)
    for commit in history.stdout.split():
        if _git(root, "rev-parse", f"{commit}:{path}").stdout.strip() == blob_id:
            return commit
    raise NotPreregistered(f"{path} as it is now is in no commit of this branch's history (uncommitted or edited): {fix}")


def check_before_result(root: str | Path, protocol: Sequence[str], result: str, fix: str) -> dict:
    """``{path: {"blob": id, "commit": registration commit}}`` for each protocol file, or
    :class:`NotPreregistered` (one line, ending in ``fix``) when the official run is not allowed."""
    root = Path(root)
    if shutil.which("git") is None:
        raise NotPreregistered(f"the official run needs its pre-registration committed in git, and git is not installed: {fix}")
    if _git(root, "rev-parse", "--is-inside-work-tree").returncode != 0:
        raise NotPreregistered(f"the official run needs its pre-registration committed in git, and {root} is not a git work "
                      f"tree: {fix}")
    if _git(root, "rev-parse", "--verify", "-q", "HEAD").returncode != 0:
        raise NotPreregistered(f"{root} has no commit yet: {fix}")
    registered = {}
    for path in protocol:
        commit = _registration_commit(root, path, fix)
        registered[path] = {"blob": _git(root, "rev-parse", f"{commit}:{path}").stdout.strip(), "commit": commit}
    added = _git(root, "log", "--format=%H", "--diff-filter=A", "--reverse", "--full-history", "HEAD", "--", result)
    first_result = next(iter(added.stdout.split()), None)
    if first_result is not None:
        for path, reg in registered.items():
            before = reg["commit"] != first_result and _git(
                root, "merge-base", "--is-ancestor", reg["commit"], first_result).returncode == 0
            if not before:
                raise NotPreregistered(f"{path} as it is now was committed in {reg['commit'][:10]}, not before the official "
                              f"result {result} (first committed in {first_result[:10]}): a protocol changed after "
                              f"its result is not a pre-registration; {fix}")
    return registered


def code_commit(root: str | Path) -> dict:
    """The commit the code ran at and whether the work tree had uncommitted changes to tracked files."""
    root = Path(root)
    head = _git(root, "rev-parse", "HEAD")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": head.stdout.strip() if head.returncode == 0 else None,
            "uncommitted_changes": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
