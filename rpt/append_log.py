"""Append-only logs read back: ``metrics.jsonl``, ``train.log``, ``segments.jsonl``.

Their writers append whole lines (text and newline in one write), so a kill can only cut the
*last* line short: a torn last line is dropped and the reader says so (:attr:`LogLines.torn`).
Any other line that does not parse is damage (an edit, a disk error, two runs writing one file):
one error naming the file and the line, never a silent cut at the first bad line (which would drop
every row after it). Bytes that are not UTF-8 and a directory where the file
should be are one error naming the file. Reading costs one pass over a file of one line per
logged step (a few milliseconds at 10^5 lines), once at start-up.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rpt.errors import ConfigError


@dataclass
class LogLines:
    path: str
    items: list[Any] = field(default_factory=list)  # the parsed lines, in file order
    numbers: list[int] = field(default_factory=list)  # their 1-based line numbers
    torn: int | None = None  # the number of a torn last line that was dropped

    def note(self) -> str | None:
        """The line saying a torn last line was dropped (None when there was none)."""
        if self.torn is None:
            return None
        return (f"note: {self.path} line {self.torn} was cut short (a run killed while writing it); "
                "dropped, the lines before it are kept")


def _damaged(path: str, what: str, detail: str) -> ConfigError:
    return ConfigError(f"{path} {detail}; it is {what}: restore it from a copy, or start a new output_dir")


def _read_bytes(path: str, what: str) -> bytes:
    """The bytes of ``path``, a regular file (a directory, a FIFO that would block, a device: one error)."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{path} is a directory, not a file; it is {what}: move the directory away")
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{path} is not a regular file; it is {what}: replace it with the file")
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror or e}); it is {what}") from None


def read_text_file(path: str, what: str) -> str:
    """The UTF-8 text of ``path``: a directory, an unreadable file or other bytes is one error naming it."""
    data = _read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise _damaged(path, what, f"line {line} is not UTF-8 text (byte {data[e.start]:#04x})") from None


def read_log(path: str, parse: Callable[[str], Any], what: str, keep_unterminated: bool = False) -> LogLines:
    """Each non-blank line of ``path`` through ``parse`` (which raises ``ValueError`` with the reason
    for a bad line). A missing file reads as empty. The last line, when no newline ends it, was cut
    by a kill: dropped (:attr:`LogLines.torn`) -- unless ``keep_unterminated`` and it parses (a
    JSON object closes itself, so one that parses is whole). ``what`` names the file's role."""
    out = LogLines(path)
    if not os.path.lexists(path):
        return out
    data = _read_bytes(path, what)
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else its unterminated last line
    for number, raw in enumerate(lines, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _damaged(path, what, f"line {number} is not UTF-8 text (byte {raw[e.start]:#04x})") from None
        if not text.strip():
            continue
        try:
            out.items.append(parse(text))
        except ValueError as e:
            raise _damaged(path, what, f"line {number} is damaged ({e}: {text.strip()[:60]!r})") from None
        out.numbers.append(number)
    if tail.strip():
        number = len(lines) + 1
        try:
            text = tail.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.reason != "unexpected end of data":  # a cut can only split the last character
                raise _damaged(path, what, f"line {number} is not UTF-8 text (byte {tail[e.start]:#04x})") from None
            text = None
        item = None
        if text is not None and keep_unterminated:
            try:
                item = parse(text)
            except ValueError:
                item = None
        if item is None:
            out.torn = number
        else:
            out.items.append(item)
            out.numbers.append(number)
    return out


class NotAJSONObject(ValueError):
    """A line of JSON Lines that is not a JSON object. ``kind``: ``"utf8"`` (``detail``: its first byte that
    is not UTF-8, 1-based in the line), ``"json"`` (json's message) or ``"type"`` (the JSON value's type
    name); ``line``: its number, where it was read from a file. The message is :func:`read_log`'s."""

    def __init__(self, kind: str, detail: Any, line: int | None = None):
        self.kind, self.detail, self.line = kind, detail, line
        super().__init__({"utf8": f"is not UTF-8 text (byte {detail} of the line)", "json": f"not JSON: {detail}",
                          "type": f"a JSON {detail}, not an object"}[kind])

    def problem(self, json: str, type: str) -> str:
        """The problem in a reader's words: ``json`` / ``type`` formatted with the detail; the UTF-8 one is
        every reader's."""
        if self.kind == "utf8":
            return f"not UTF-8 text (byte {self.detail} of the line); save the file as UTF-8"
        return (json if self.kind == "json" else type).format(self.detail)


def json_object(text: str) -> dict[str, Any]:
    """One line of JSON Lines as its object (:class:`NotAJSONObject` saying why not): the one parse of a
    line of the run's logs (:func:`read_log`), of user JSONL (``rpt.evaluation.user_jsonl``) and of
    ``sample.py --prompts``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise NotAJSONObject("json", e.msg) from None
    if not isinstance(value, dict):
        raise NotAJSONObject("type", type(value).__name__)
    return value


def json_object_lines(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each line of the JSON Lines file ``path``, blank lines skipped; the first
    line that is not UTF-8 text, not JSON or not an object raises :class:`NotAJSONObject` with its number.
    Read as bytes, so that a line that is not UTF-8 is named by its number."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise NotAJSONObject("utf8", e.start + 1, number) from None
            if not text.strip():
                continue
            try:
                value = json_object(text)
            except NotAJSONObject as e:
                raise NotAJSONObject(e.kind, e.detail, number) from None
            yield number, value


def check_increasing(lines: LogLines, step_of: Callable[[Any], int], what: str) -> None:
    """The steps of a log's lines only increase (a repeated or earlier step: two runs wrote the file)."""
    last = None
    for item, number in zip(lines.items, lines.numbers):
        step = step_of(item)
        if last is not None and step <= last:
            raise _damaged(lines.path, what, f"line {number} is step {step} after step {last} (a run's steps only "
                                             "increase: two runs wrote this file)")
        last = step
