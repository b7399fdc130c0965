"""The byte-level BPE tokenizer (``qkov.data.tokenizer``): trained locally to its vocabulary size,
end-of-text at id 0, any string round-trips, and how each token reads."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import qkov
from qkov.data.tokenizer import (
    BYTE_LEVEL,
    END_OF_TEXT,
    end_of_text_id,
    readable_bytes,
    token_strings,
    train_tokenizer,
)


def corpus_texts(folder):
    return [path.read_text() for path in sorted(folder.iterdir())]


def test_tokenizer_is_byte_level_bpe_with_end_of_text(tiny_corpus):
    texts = corpus_texts(tiny_corpus)
    tokenizer = train_tokenizer(texts, 300)
    assert tokenizer.get_vocab_size() == 300
    assert tokenizer.token_to_id(END_OF_TEXT) == 0
    text = "def f(self):\n    return 'é ☃'"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte level: anything round-trips
    with pytest.raises(qkov.QkovError, match="at least 257"):
        train_tokenizer(texts, 100)


def test_the_smallest_vocabulary_is_the_bytes_and_end_of_text(tiny_corpus):
    tokenizer = train_tokenizer(corpus_texts(tiny_corpus), 257)
    assert tokenizer.get_vocab_size() == 257 and end_of_text_id(tokenizer) == 0
    assert len(tokenizer.encode("self").ids) == 4  # no merges: one token per byte
    assert len(tokenizer.encode("é").ids) == 2  # two bytes in UTF-8


def test_end_of_text_is_required():
    without = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    with pytest.raises(qkov.QkovError, match=r"^tokenizer has no <\|endoftext\|> token$"):
        end_of_text_id(without)


def test_token_strings_are_the_decoded_tokens_or_their_ids(tiny_corpus):
    assert token_strings(None, 3) == ["#0", "#1", "#2"]
    tokenizer = train_tokenizer(corpus_texts(tiny_corpus), 300)
    strings = token_strings(tokenizer, 300)
    assert len(strings) == 300 and strings[0] == ""  # decoding skips the special end-of-text token
    self_id = tokenizer.token_to_id("self")
    assert self_id is not None and strings[self_id] == "self"  # a merge the corpus makes


def test_readable_bytes_writes_broken_characters_as_their_bytes():
    assert readable_bytes(" é ☃".encode()) == " é ☃"
    assert readable_bytes(b" \xe2\x80") == " <E2 80>"  # the start of "—" without its last byte
    assert readable_bytes(b"\x94x\xe2\x80") == "<94>x<E2 80>"  # one bracket per run of bytes
    assert readable_bytes(b"ab\x80\xff") == "ab<80 FF>"
    assert readable_bytes(b"") == ""


def test_the_byte_level_alphabet_is_the_tokenizers_own():
    assert sorted(BYTE_LEVEL) == sorted(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(BYTE_LEVEL.values()) == list(range(256))
    assert BYTE_LEVEL["Ġ"] == ord(" ") and BYTE_LEVEL["a"] == ord("a")  # GPT-2's stand-in for a space


def test_every_byte_level_token_reads_distinctly(tiny_corpus):
    text = "x = '— “quoted” ☃ é'\n" * 20  # multi-byte characters the merges split and join
    tokenizer = train_tokenizer(corpus_texts(tiny_corpus) + [text], 400)
    n = tokenizer.get_vocab_size()  # the merges this small corpus makes: fewer than asked
    decoded = [tokenizer.decode([i]) for i in range(n)]
    strings = token_strings(tokenizer, n)
    assert sum("\ufffd" in s for s in decoded) >= 100  # most lone bytes above 0x7F do not decode alone
    assert not any("\ufffd" in s for s in strings)
    assert len(set(strings[1:])) == n - 1  # every token but the (empty) end of text reads distinctly
    lone = tokenizer.token_to_id("â")  # the byte 0xE2 (GPT-2's stand-in for it is "â")
    assert strings[lone] == "<E2>"
    for i, s in enumerate(strings):  # what reads as text is the token's own bytes
        if "<" not in s and i > 0:
            assert s == decoded[i]


def test_a_replacement_character_that_is_not_byte_level_stays(tiny_corpus):
    word = Tokenizer(models.WordLevel({"\ufffd": 0, "a": 1}, unk_token="a"))
    assert token_strings(word, 2) == ["\ufffd", "a"]
