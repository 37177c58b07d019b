"""Python values <-> JSON text, for the sandbox's pipes (standard library only).

Both sides use it: the parent encodes a test's inputs, the sandboxed child decodes them, calls
the program's function and encodes what it returns; the parent decodes that and compares it
with the expected output. The child is untrusted, so :func:`decode` accepts only plain data
(``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``,
``set``, ``frozenset``, ``dict``) to a bounded depth, and never calls anything the message names:
whatever a program writes, the parent ends up holding plain values or an :class:`Opaque`, which
equals nothing (a program cannot smuggle in an object whose ``__eq__`` always says yes).

Plain JSON carries ``None``/``bool``/``float``/``str``/``list`` and small ints; everything else is
a one-key-tagged object ``{"$t": kind, "v": ...}`` (JSON objects are used for nothing else).
Types are kept exactly (a tuple is not a list), as EvalPlus compares with ``==`` and ``type()``.
Loaded into the sandbox from its file by path (not as part of the ``rpt`` package).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from operator import itemgetter

MAX_DEPTH = 200
_SMALL_INT = 1 << 53  # beyond this JSON numbers lose precision in other readers; and Python caps
                      # int <-> decimal string conversion at 4300 digits, while hex is unlimited


class Opaque:
    """A value the wire cannot carry (a function, a generator, a regex match, ...): its type name
    and a short repr. Equal to nothing, not even another ``Opaque``."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = type_name, text

    def __eq__(self, other) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<opaque {self.type_name}: {self.text}>"


class WireError(ValueError):
    """A message that is not a well-formed encoded value."""


class TooLarge(ValueError):
    """The value has more parts than the encoding budget allows."""


MAX_NODES = 4_000_000  # parts of one value (a string counts once): ~tens of MB of JSON at most


def to_json(value, depth: int = 0, budget: list | None = None):
    """``value`` as a JSON-ready structure (exact types preserved; see the module docstring).

    Raises :class:`TooLarge` once more than ``MAX_NODES`` parts have been encoded (checked as it
    goes, so a huge value costs the budget, not its size); ``budget`` is the shared counter.
    """
    if budget is None:
        budget = [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise TooLarge(f"more than {MAX_NODES} parts")
    if depth > MAX_DEPTH:
        return {"$t": "opaque", "v": ["deep", "nesting too deep"]}
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        value = int(value)  # an int subclass travels as its value
        return value if -_SMALL_INT < value < _SMALL_INT else {"$t": "int", "v": format(value, "x")}
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, complex):
        return {"$t": "complex", "v": [value.real, value.imag]}
    if isinstance(value, (bytes, bytearray)):
        return {"$t": "bytes", "v": bytes(value).hex()}
    if isinstance(value, list):
        return [to_json(v, depth + 1, budget) for v in value]
    if isinstance(value, tuple):
        return {"$t": "tuple", "v": [to_json(v, depth + 1, budget) for v in value]}
    if isinstance(value, (set, frozenset)):
        kind = "frozenset" if isinstance(value, frozenset) else "set"
        return {"$t": kind, "v": [to_json(v, depth + 1, budget) for v in value]}
    if isinstance(value, dict):
        return {"$t": "dict", "v": [[to_json(k, depth + 1, budget), to_json(v, depth + 1, budget)] for k, v in value.items()]}
    try:
        text = repr(value)[:200]
    except Exception:  # a hostile __repr__
        text = "?"
    return {"$t": "opaque", "v": [type(value).__name__[:100], text]}


def encode(value) -> str:
    """One line of JSON text for ``value``."""
    return json.dumps(to_json(value), separators=(",", ":"))


def from_json(obj, depth: int = 0):
    """Inverse of :func:`to_json`, strict: anything else raises :class:`WireError`."""
    if depth > MAX_DEPTH + 1:
        raise WireError("nesting too deep")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [from_json(v, depth + 1) for v in obj]
    if not isinstance(obj, dict) or set(obj) != {"$t", "v"}:
        raise WireError("not an encoded value")
    kind, v = obj["$t"], obj["v"]
    try:
        if kind == "int":
            if not isinstance(v, str) or len(v) > 1 << 20:
                raise WireError("bad int")
            return int(v, 16)
        if kind == "complex":
            re_, im = v
            if not isinstance(re_, (int, float)) or not isinstance(im, (int, float)):
                raise WireError("bad complex")
            return complex(re_, im)
        if kind == "bytes":
            return bytes.fromhex(v)
        if kind == "tuple":
            return tuple(from_json(x, depth + 1) for x in _items(v))
        if kind in ("set", "frozenset"):
            members = [from_json(x, depth + 1) for x in _items(v)]
            check_hashes(members)  # before a hash table is built from them
            return set(members) if kind == "set" else frozenset(members)
        if kind == "dict":
            pairs = []
            for pair in _items(v):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise WireError("bad dict item")
                pairs.append((from_json(pair[0], depth + 1), from_json(pair[1], depth + 1)))
            check_hashes([key for key, _ in pairs])
            return dict(pairs)
        if kind == "opaque":
            name, text = v
            return Opaque(str(name)[:100], str(text)[:200])
    except WireError:
        raise
    except Exception as exc:  # unhashable set member, bad hex, complex(10**400, 0) (OverflowError), ...
        raise WireError(f"bad {kind}: {type(exc).__name__}") from None
    raise WireError(f"unknown kind {kind!r}")


MAX_SAME_HASH = 16  # distinct values sharing one hash: more is hash flooding, never a real output


def check_hashes(values) -> None:
    """Raise :class:`WireError` when more than ``MAX_SAME_HASH`` distinct hashable ``values``
    share one hash. Python's hashes of ints are ``x mod (2**61 - 1)`` (and tuples, floats follow),
    so a program can send thousands of different values that all collide: building a set or dict
    of them costs quadratic time in the parent (50,000 took 13 s). This check costs at most
    ``MAX_SAME_HASH`` comparisons per value, and buckets by the hash itself (distinct ints of at
    most 61 bits, which do not collide)."""
    values = list(values)
    try:
        keyed = list(zip(map(hash, values), values))  # the usual case, at C speed
    except TypeError:  # an unhashable value (a set of it fails on its own): value by value
        keyed = []
        for value in values:
            try:
                keyed.append((hash(value), value))
            except TypeError:
                continue
    counts = Counter(map(itemgetter(0), keyed))
    if max(counts.values(), default=0) <= MAX_SAME_HASH:
        return  # no hash is crowded, equal values or not
    buckets: dict[int, list] = {}
    for key, value in keyed:
        if counts[key] <= MAX_SAME_HASH:
            continue
        same = buckets.setdefault(key, [])
        if not any(value is other or value == other for other in same):
            same.append(value)
            if len(same) > MAX_SAME_HASH:
                raise WireError(f"more than {MAX_SAME_HASH} different values with one hash (hash flooding)")


def _items(v) -> list:
    if not isinstance(v, list):
        raise WireError("expected a list")
    return v


def decode(text: str | bytes):
    """Parse one line written by :func:`encode`; any malformation raises :class:`WireError`."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"malformed JSON: {type(exc).__name__}") from None
    return from_json(obj)


def canonical(value) -> str:
    """A comparison key: equal plain values give equal text (NaN included), used to match the
    arguments a replayed test passes with the ones the child recorded."""
    return json.dumps(to_json(value), separators=(",", ":"), sort_keys=True, default=str)


def is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)
