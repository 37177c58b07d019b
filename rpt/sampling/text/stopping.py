"""When a row stops: end-of-sequence tokens and stop strings, shared by both decoders.

RPT may rewrite the last ``w - 1`` tokens until the window moves past them, so a row is checked once
its position ``t`` has *settled* (all RPT iterations done): an EOS anywhere among the generated tokens
(it can only have entered through the current window: the row would have stopped earlier otherwise)
ends the row right after the first EOS; a stop string anywhere in the generated text ends it with
every token kept (callers cut the text with :func:`truncate_at_stop`).
"""

from __future__ import annotations

from collections.abc import Sequence

# A character is at most 4 UTF-8 bytes and every token carries at least one byte, so the last
# ``4 * len(longest stop) + slack`` tokens hold any stop string that the newest tokens can complete.
_BYTES_PER_CHAR = 4


class StopChecker:
    """Decides, after a position settles, whether a row is finished and how many tokens it keeps."""

    def __init__(self, eos_token_ids: Sequence[int] = (), stop: Sequence[str] = (), tokenizer=None, window: int = 1):
        if stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the generated text; pass tokenizer=...")
        self.eos = set(int(i) for i in eos_token_ids)
        self.stop = list(stop)
        self.tokenizer = tokenizer
        # RPT can change the newest `window` tokens, so a stop string may end that far back.
        self._tail = _BYTES_PER_CHAR * max((len(s) for s in self.stop), default=0) + window + 8

    def check(self, generated: Sequence[int], since: int = 0) -> tuple[str | None, int]:
        """``(reason, keep)``: reason is ``"eos"``, ``"stop"`` or None; keep = tokens to keep.

        ``since``: tokens before it were checked at an earlier position and have not changed since
        (they left the window), so only the EOS scan can skip them.
        """
        if self.eos:
            for i in range(max(since, 0), len(generated)):
                if generated[i] in self.eos:
                    return "eos", i + 1
        if self.stop:
            text = self.tokenizer.decode(list(generated[-self._tail:]), skip_special_tokens=False)
            if any(s in text for s in self.stop):
                return "stop", len(generated)
        return None, len(generated)


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (excluding) the earliest occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]
