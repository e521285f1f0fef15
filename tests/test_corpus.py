"""The generated English -> Lirish corpus: determinism, grammar rules, file output."""

from __future__ import annotations

import pytest

from seq2onnx.model.corpus import (
    DEFAULT_PAIRS,
    MAX_PAIRS,
    Clause,
    NounPhrase,
    PrepPhrase,
    english,
    generate_pairs,
    lirish_number,
    translate,
    write_corpus,
)


def test_same_seed_same_pairs_and_other_seed_differs():
    assert generate_pairs(300, seed=5) == generate_pairs(300, seed=5)
    assert generate_pairs(300, seed=5) != generate_pairs(300, seed=6)


def test_prefix_property_of_n():
    # The same seed draws the same stream, so a smaller corpus is a prefix of a larger one.
    assert generate_pairs(1000, seed=3)[:100] == generate_pairs(100, seed=3)


@pytest.mark.slow
def test_pairs_distinct_and_well_formed():
    pairs = generate_pairs(DEFAULT_PAIRS, seed=0)
    assert len(pairs) == DEFAULT_PAIRS
    assert len(set(pairs)) == DEFAULT_PAIRS
    for src, tgt in pairs:
        for text in (src, tgt):
            assert 3 <= len(text.split()) <= 14
            assert text == " ".join(text.split())  # single spaces, no edges
            assert "\t" not in text and "\n" not in text
        assert tgt.isascii() and tgt == tgt.lower()


def test_bad_n_raises():
    with pytest.raises(ValueError, match="n=-1"):
        generate_pairs(-1)
    with pytest.raises(ValueError, match=f"n={MAX_PAIRS + 1}"):
        generate_pairs(MAX_PAIRS + 1)
    assert generate_pairs(0) == []


def test_sov_order_and_adjective_after_noun():
    c = Clause(NounPhrase("dog", adj="big"), "see", NounPhrase("cat", det="a"))
    assert english(c) == "the big dog sees a cat"
    assert translate(c) == "lo toma gran na mira velet"


def test_plural_agreement_on_noun_adjective_and_verb():
    c = Clause(NounPhrase("dog", plural=True, adj="big"), "see", NounPhrase("cat", plural=True, adj="red"))
    assert english(c) == "the big dogs see the red cats"
    assert translate(c) == "lo tomari granni lo mirari rosani velen"


def test_verb_agrees_with_subject_not_object():
    c = Clause(NounPhrase("cat"), "chase", NounPhrase("mouse", plural=True, det=None))
    assert english(c) == "the cat chases mice"
    assert translate(c) == "lo mira tikiri kaset"


def test_past_tense_suffix_and_irregular_english():
    sg = Clause(NounPhrase("man", det="a"), "eat", NounPhrase("apple", det="a"), past=True)
    pl = Clause(NounPhrase("man", plural=True), "eat", NounPhrase("apple"), past=True)
    assert english(sg) == "a man ate an apple"
    assert translate(sg) == "na soro na poma manjot"
    assert english(pl) == "the men ate the apple"
    assert translate(pl) == "lo sorori lo poma manjon"


def test_numbers_words_and_digits_map_to_same_target_after_np():
    words = Clause(
        NounPhrase("wolf", plural=True, det=None, number=3, adj="old"),
        "sleep",
        pp=PrepPhrase("in", NounPhrase("forest")),
    )
    digits = Clause(
        NounPhrase("wolf", plural=True, det=None, number=3, digits=True, adj="old"),
        "sleep",
        pp=PrepPhrase("in", NounPhrase("forest")),
    )
    assert english(words) == "three old wolves sleep in the forest"
    assert english(digits) == "3 old wolves sleep in the forest"
    assert translate(words) == translate(digits) == "lupari veloni tre lo silva ve dormen"


def test_compound_numbers():
    assert [lirish_number(v) for v in (2, 9, 10, 11, 15, 19, 20)] == [
        "du",
        "nov",
        "dek",
        "dekun",
        "dekpen",
        "deknov",
        "dudek",
    ]
    with pytest.raises(ValueError, match="number=21"):
        lirish_number(21)


def test_prepositional_phrase_moves_before_verb():
    c = Clause(NounPhrase("dog"), "see", NounPhrase("cat", det="a"), pp=PrepPhrase("in", NounPhrase("house")))
    assert english(c) == "the dog sees a cat in the house"
    assert translate(c) == "lo toma na mira lo dala ve velet"


def test_ungrammatical_phrases_rejected():
    with pytest.raises(ValueError, match="singular"):
        NounPhrase("dog", det=None)
    with pytest.raises(ValueError, match="plural"):
        NounPhrase("dog", number=2)
    with pytest.raises(ValueError, match="digits=True"):
        NounPhrase("dog", plural=True, number=15)
    with pytest.raises(ValueError, match="transitive"):
        Clause(NounPhrase("dog"), "see")
    with pytest.raises(ValueError, match="'unicorn'"):
        NounPhrase("unicorn")


def test_english_agreement_holds_in_generated_corpus():
    # Present tense: a plural subject never takes "sees"; a singular one never takes "see".
    pairs = generate_pairs(2000, seed=1)
    present_sg = [s for s, t in pairs if t.endswith("et")]
    present_pl = [s for s, t in pairs if t.endswith("en")]
    assert present_sg and present_pl
    assert all(" see " not in f" {s} " for s in present_sg)
    assert all(" sees " not in f" {s} " for s in present_pl)


def test_write_corpus_round_trip(tmp_path):
    path = write_corpus(tmp_path / "toy.tsv", 50, seed=2)
    assert path == tmp_path / "toy.tsv"
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""
    assert [tuple(line.split("\t")) for line in lines[:-1]] == generate_pairs(50, seed=2)
    assert [p.name for p in tmp_path.iterdir()] == ["toy.tsv"]  # no temp file left behind


def test_write_corpus_failure_leaves_old_file(tmp_path):
    path = write_corpus(tmp_path / "toy.tsv", 5)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        write_corpus(path, -3)
    assert path.read_bytes() == before
    assert len(list(tmp_path.iterdir())) == 1
