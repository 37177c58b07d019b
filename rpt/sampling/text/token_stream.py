"""Streaming tokens as RPT makes them final: the token stream (``put`` / ``end``) and a text printer."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from rpt.sampling.text.stopping import truncate_at_stop


class FrozenStream:
    """Feeds a streamer (``put`` / ``end``, Hugging Face protocol) the tokens RPT can no longer change."""

    def __init__(self, streamer, prompt: list[int], lag: int):
        self.streamer, self.sent = streamer, 0
        self.lag = lag  # the newest `lag` tokens may still be revisited; everything before them is final
        if streamer is not None:
            streamer.put(torch.tensor(prompt, dtype=torch.long))

    def update(self, generated: list[int], final: bool = False) -> None:
        if self.streamer is None:
            return
        frozen = len(generated) if final else max(len(generated) - self.lag, 0)
        if frozen > self.sent:
            self.streamer.put(torch.tensor(generated[self.sent:frozen], dtype=torch.long))
            self.sent = frozen

    def end(self, generated: list[int]) -> None:
        if self.streamer is not None:
            self.update(generated, final=True)
            self.streamer.end()


def check_streamer(streamer, batch: int) -> None:
    if streamer is not None and batch != 1:
        raise ValueError(f"streaming needs a single prompt, got a batch of {batch}")


class TextStream:
    """Prints a single row's completion as its tokens freeze, never printing past a stop string.

    Speaks the ``put`` / ``end`` protocol of Hugging Face streamers: the first ``put`` is the prompt
    as fed (after token healing, possibly shorter than ``prompt_text``). Healing makes the first
    generated tokens re-spell the prompt's removed end, which is not printed again. Text that could
    still become the start of a stop string, and a trailing incomplete UTF-8 character, are held
    back until more tokens come or the end.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = (), file=None, prompt_text: str = ""):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.file = file or sys.stdout
        self.prompt_text = prompt_text
        self.ids: list[int] | None = None
        self.printed = 0
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._skip = ""

    def _text(self) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self._skip and text.startswith(self._skip):
            text = text[len(self._skip):]
        return truncate_at_stop(text, self.stop)

    def put(self, value) -> None:
        ids = value.tolist() if hasattr(value, "tolist") else list(value)
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        if self.ids is None:  # the prompt: what healing removed from its text is re-generated first
            fed = self.tokenizer.decode(ids, skip_special_tokens=True)
            if self.prompt_text.startswith(fed):
                self._skip = self.prompt_text[len(fed):]
            self.ids = []
            return
        self.ids.extend(int(i) for i in ids)
        text = self._text()
        safe = len(text) - self._hold
        while safe > self.printed and text[safe - 1] == "\ufffd":
            safe -= 1
        if safe > self.printed:
            self.file.write(text[self.printed:safe])
            self.file.flush()
            self.printed = safe

    def end(self) -> None:
        text = self._text() if self.ids is not None else ""
        self.file.write(text[self.printed:] + "\n")
        self.file.flush()
        self.printed = len(text)


class ReplayGuard:
    """A streamer seen by a decode that may be restarted (a compiled decode that falls back to eager,
    :mod:`rpt.decode_forward.compile_guard`): it forwards everything and counts what it forwarded; :meth:`restarted`
    gives the streamer for the rerun, which drops the prompt and the tokens the streamer already has
    (the rerun decodes the same tokens: it starts from the same prompt with the same keyed draws)."""

    def __init__(self, streamer):
        self.streamer, self.puts, self.tokens, self.ended = streamer, 0, 0, False

    def put(self, value) -> None:
        if self.puts:  # the first put is the prompt
            self.tokens += int(value.numel())
        self.puts += 1
        self.streamer.put(value)

    def end(self) -> None:
        self.ended = True
        self.streamer.end()

    def restarted(self):
        return _Skipping(self.streamer, self.puts > 0, self.tokens, self.ended)


class _Skipping:
    def __init__(self, streamer, prompt: bool, tokens: int, ended: bool):
        self.streamer, self.prompt, self.tokens, self.ended = streamer, prompt, tokens, ended
        self.seen_prompt = False

    def put(self, value) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            if self.prompt:
                return
        skip = min(self.tokens, int(value.numel()))
        self.tokens -= skip
        if value.numel() > skip:
            self.streamer.put(value.reshape(-1)[skip:])

    def end(self) -> None:
        if not self.ended:
            self.streamer.end()
