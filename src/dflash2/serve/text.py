"""Tokens to text as they are committed, with stop strings found across token boundaries.

Contract: `TextStream(tokenizer, stop)`; `push(token)` adds one committed token and returns the
text that may be shown now (possibly ""); `finish()` returns what was held back once decoding
ended for another reason. After a push that completes a stop string, `stopped` is True, the text
is cut just before the stop string (OpenAI: the stop string is not returned) and further pushes
return "". The concatenation of everything returned equals `text`.

Text is held back while it could still change or be cut: an incomplete UTF-8 sequence (the
decoder shows it as U+FFFD) waits for the next token, and a tail that is the beginning of a stop
string waits until it either completes the stop string or stops matching. Decoding is incremental
(only a short window of recent tokens is re-decoded per token), with special tokens skipped.
"""
from __future__ import annotations

_REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.tokens: list[int] = []
        self.text = ""            # decoded so far (cut at a stop string once found)
        self.sent = 0             # characters of `text` already returned
        self.stopped = False
        self._prefix = 0          # window start: tokens before it are fully decoded
        self._read = 0            # tokens up to here have produced text
        self._longest = max((len(s) for s in self.stop), default=0)

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.tokens.append(int(token))
        before = len(self.text)
        self.text += self._delta()
        if self.stop and len(self.text) > before:
            self._find_stop(max(0, before - self._longest + 1))
        return self._release(final=self.stopped)

    def finish(self) -> str:
        if not self.stopped and self._read < len(self.tokens):  # a dangling partial character
            before = len(self.text)
            window = self.tokens[self._prefix:]
            self.text += self._decode(window)[len(self._decode(self.tokens[self._prefix:self._read])):]
            self._read = len(self.tokens)
            if self.stop:
                self._find_stop(max(0, before - self._longest + 1))
        return self._release(final=True)

    # ------------------------------------------------------------------ pieces
    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True) if tokens else ""

    def _delta(self) -> str:
        """The new text the last token completes (decoded with a little left context, so that
        tokenizers that drop leading spaces at the start of a sequence decode correctly)."""
        prefix_text = self._decode(self.tokens[self._prefix:self._read])
        new_text = self._decode(self.tokens[self._prefix:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self.tokens)
        return new_text[len(prefix_text):]

    def _find_stop(self, start: int) -> None:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that begins some stop string."""
        for n in range(min(self._longest - 1, len(self.text) - self.sent), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0

    def _release(self, final: bool) -> str:
        end = len(self.text) if final or not self.stop else len(self.text) - self._held_back()
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:end], end
        return piece
