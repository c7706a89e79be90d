"""specdemo.engine.tokens on a byte-level BPE, the kind real LMs use: there a character of several
UTF-8 bytes ("é", "日", an emoji) may take several tokens, and no token alone decodes to it."""

import pytest

from specdemo.engine.tokens import cut_at_eos, token_text
from tests.tiny import byte_level_tokenizer

# ASCII only: the tokenizer learns merges of English, never of the characters below.
CORPUS = ["the cat sat on the mat", "a cafe in the city", "the text of the tokens", "one token at a time"] * 4
SPLIT_CHARACTERS = {"é": 2, "日": 3, "本": 3, "🙂": 4}  # UTF-8 bytes, one token each
TEXT = "the café in 日本 🙂 sat on the mat"


@pytest.fixture(scope="module")
def tokenizer():
    tok = byte_level_tokenizer(CORPUS)
    # The tests below mean something only if each of these characters is split into its bytes.
    for character, n_bytes in SPLIT_CHARACTERS.items():
        assert len(tok.encode(character)) == n_bytes, character
    return tok


def pieces(tokenizer, ids: list[int]) -> list[str]:
    return [token_text(tokenizer, ids, i) for i in range(len(ids))]


def test_the_pieces_of_a_text_join_to_the_text(tokenizer):
    ids = tokenizer.encode(TEXT)
    assert "".join(pieces(tokenizer, ids)) == TEXT


def test_a_split_character_comes_out_whole_on_its_last_token(tokenizer):
    ids = tokenizer.encode(TEXT)
    texts = pieces(tokenizer, ids)
    assert not any("\ufffd" in text for text in texts), "no piece shows half a character"
    for character, n_bytes in SPLIT_CHARACTERS.items():
        last = next(i for i, text in enumerate(texts) if character in text)
        assert texts[last - n_bytes + 1 : last] == [""] * (n_bytes - 1), character


def test_cut_at_eos_keeps_everything_up_to_the_first_eos(tokenizer):
    eos = tokenizer.eos_token_id
    first, second = tokenizer.encode("the café"), tokenizer.encode(" 日本")
    ids = first + [eos] + second + [eos]
    assert cut_at_eos(ids, {eos}) == first + [eos]
    assert tokenizer.decode(cut_at_eos(ids, {eos}), skip_special_tokens=True) == "the café"


def test_cut_at_eos_stops_at_whichever_eos_comes_first_and_keeps_all_without_one(tokenizer):
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("a cat 🙂 sat")
    other_eos = ids[3]  # a model may end with several ids (an end-of-turn beside the EOS)
    assert cut_at_eos(ids, {eos, other_eos}) == ids[:4]
    assert cut_at_eos(ids, {eos}) == ids
    assert cut_at_eos(tuple(ids), {eos}) == ids  # always a list, never the caller's sequence
