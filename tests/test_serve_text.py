"""Incremental detokenization and stop strings (`dflash2.serve.text.TextStream`), with a byte-level
tokenizer that, like real byte-level BPE tokenizers, decodes a cut UTF-8 sequence as U+FFFD."""
from __future__ import annotations

import pytest

from dflash2.serve.text import TextStream


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte + 3); ids 0-2 are special (pad / BOS / EOS)."""

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")


TEXT = "héllo wörld 🎉 — ok, done."


def pieces(stream: TextStream, ids: list[int]) -> list[str]:
    out = []
    for token in ids:
        out.append(stream.push(token))
        if stream.stopped:
            break
    if not stream.stopped:
        out.append(stream.finish())
    return out


def test_streamed_text_equals_the_full_decode_and_never_shows_a_cut_character():
    tok = ByteTokenizer()
    ids = tok.encode(TEXT) + [2]                       # EOS at the end is skipped
    got = pieces(TextStream(tok), ids)
    assert "".join(got) == TEXT and not any("\ufffd" in p for p in got)
    assert got.count("") >= 5                          # the multi-byte characters waited for their last byte


@pytest.mark.parametrize("stop, expected", [
    (("wö",), "héllo "),                               # a stop string across tokens and inside a character
    (("🎉",), "héllo wörld "),
    (("ld", "llo"), "hé"),                             # the earliest match wins
    (("done.",), "héllo wörld 🎉 — ok, "),
    (("absent",), TEXT),
])
def test_stop_strings_cut_the_text_before_them(stop, expected):
    tok = ByteTokenizer()
    stream = TextStream(tok, stop)
    assert "".join(pieces(stream, tok.encode(TEXT))) == expected == stream.text
    assert stream.stopped == (expected != TEXT)


def test_a_possible_stop_prefix_is_held_back_until_it_stops_matching():
    tok = ByteTokenizer()
    stream = TextStream(tok, ("xyz",))
    shown = [stream.push(t) for t in tok.encode("abxyq")]
    assert shown == ["a", "b", "", "", "xyq"] and not stream.stopped
    assert stream.finish() == ""


def test_finish_releases_a_dangling_partial_character():
    tok = ByteTokenizer()
    stream = TextStream(tok)
    ids = tok.encode("ok é")[:-1]                      # the last byte of é never comes
    assert "".join(pieces(stream, ids)) == "ok \ufffd"
