"""The byte-level BPE tokenizer (``qkov.data.tokenizer``): trained locally to its vocabulary size,
end-of-text at id 0, any string round-trips, and how each token reads."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

import qkov
from qkov.data.tokenizer import END_OF_TEXT, end_of_text_id, token_strings, train_tokenizer


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
