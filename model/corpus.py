"""A deterministic generated parallel corpus: English -> Lirish, an invented language.

The task is small enough for a 2-layer Transformer to learn in minutes, yet it is not a
word-for-word substitution; Lirish differs from English in ways a model has to learn:

* word order is subject-object-verb, and a prepositional phrase becomes a postpositional
  phrase placed before the verb: "the dog sees a cat in the house" -> "lo toma na mira lo dala ve velet";
* adjectives follow their noun: "the big dog" -> "lo toma gran";
* number agreement: plural nouns take -ri, adjectives agree with their noun (-ni),
  the verb agrees with its subject (-t singular, -n plural);
* tense is a verb suffix (-e- present, -o- past), before the number suffix;
* counts ("two", "3", up to 20) become number words after the noun phrase; 11-19 and 20
  are built from parts (dek-un = 10+1, du-dek = 2*10), so they have structure too;
* "the" -> "lo", "a"/"an" -> "na"; bare plurals have no determiner.

English is grammatical: "sees"/"see", "saw", irregular plurals (men, mice, wolves), "an old dog".
Everything is lowercase ASCII words separated by single spaces, without punctuation.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from seq2onnx import atomic

DEFAULT_PAIRS = 20000
# Far below the number of distinct sentences (~1e12); a cap keeps a typo like n=10**9 from
# running for hours, and keeps the rejection sampling of duplicates fast.
MAX_PAIRS = 2_000_000

# English singular, English plural, Lirish stem. Subjects are animate so English reads
# naturally; objects may be any noun.
ANIMATE_NOUNS: dict[str, tuple[str, str]] = {
    "dog": ("dogs", "toma"),
    "cat": ("cats", "mira"),
    "bird": ("birds", "pilo"),
    "horse": ("horses", "karu"),
    "cow": ("cows", "bena"),
    "child": ("children", "nilu"),
    "man": ("men", "soro"),
    "woman": ("women", "vela"),
    "mouse": ("mice", "tiki"),
    "teacher": ("teachers", "lensa"),
    "farmer": ("farmers", "garo"),
    "king": ("kings", "reko"),
    "queen": ("queens", "remi"),
    "wolf": ("wolves", "lupa"),
    "fox": ("foxes", "fesu"),
}
THING_NOUNS: dict[str, tuple[str, str]] = {
    "house": ("houses", "dala"),
    "tree": ("trees", "bosi"),
    "river": ("rivers", "fluma"),
    "apple": ("apples", "poma"),
    "book": ("books", "libo"),
    "letter": ("letters", "kirta"),
    "ship": ("ships", "navo"),
    "car": ("cars", "koto"),
    "stone": ("stones", "peta"),
    "flower": ("flowers", "floni"),
    "box": ("boxes", "kesa"),
    "cake": ("cakes", "tarta"),
    "garden": ("gardens", "jarda"),
    "forest": ("forests", "silva"),
    "city": ("cities", "urbo"),
}
NOUNS: dict[str, tuple[str, str]] = {**ANIMATE_NOUNS, **THING_NOUNS}
# Nouns that read well after a preposition ("in the garden").
PLACE_NOUNS = ("house", "river", "garden", "forest", "city", "tree", "ship", "car", "box")

ADJECTIVES: dict[str, str] = {
    "big": "gran",
    "small": "piku",
    "red": "rosa",
    "old": "velo",
    "young": "juna",
    "happy": "feli",
    "sad": "trista",
    "green": "verda",
    "black": "nera",
    "white": "alba",
    "tall": "alta",
    "quick": "rapa",
    "slow": "lenta",
    "kind": "dula",
    "angry": "ira",
    "brave": "bravi",
    "quiet": "kalma",
    "strong": "forta",
    "blue": "bluva",
    "tiny": "mina",
}

# English base, third person singular present, past; Lirish stem (ends in a consonant so the
# tense+number suffix reads as one syllable).
TRANSITIVE_VERBS: dict[str, tuple[str, str, str]] = {
    "see": ("sees", "saw", "vel"),
    "like": ("likes", "liked", "am"),
    "find": ("finds", "found", "trov"),
    "carry": ("carries", "carried", "port"),
    "follow": ("follows", "followed", "sek"),
    "help": ("helps", "helped", "jut"),
    "hear": ("hears", "heard", "aud"),
    "chase": ("chases", "chased", "kas"),
    "feed": ("feeds", "fed", "nutr"),
    "meet": ("meets", "met", "renk"),
    "watch": ("watches", "watched", "spek"),
    "call": ("calls", "called", "vok"),
    "bring": ("brings", "brought", "brel"),
    "eat": ("eats", "ate", "manj"),
    "take": ("takes", "took", "pren"),
    "want": ("wants", "wanted", "vol"),
}
INTRANSITIVE_VERBS: dict[str, tuple[str, str, str]] = {
    "sleep": ("sleeps", "slept", "dorm"),
    "run": ("runs", "ran", "kur"),
    "sing": ("sings", "sang", "kant"),
    "wait": ("waits", "waited", "tend"),
    "dance": ("dances", "danced", "bal"),
    "swim": ("swims", "swam", "nad"),
}
VERBS = {**TRANSITIVE_VERBS, **INTRANSITIVE_VERBS}

PREPOSITIONS: dict[str, str] = {"in": "ve", "near": "pri", "under": "sub", "behind": "dor", "with": "kon"}
DETERMINERS: dict[str, str] = {"the": "lo", "a": "na"}

NUMBER_WORDS_EN = {
    2: "two",
    3: "three",
    4: "four",
    5: "five",
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
    11: "eleven",
    12: "twelve",
}
_UNITS_LI = {1: "un", 2: "du", 3: "tre", 4: "kar", 5: "pen", 6: "ses", 7: "sep", 8: "ok", 9: "nov"}
MIN_NUMBER, MAX_NUMBER = 2, 20

NOUN_PLURAL, ADJ_PLURAL = "ri", "ni"
TENSE_SUFFIX = {False: "e", True: "o"}  # keyed by past
NUMBER_SUFFIX = {False: "t", True: "n"}  # keyed by plural subject


def lirish_number(value: int) -> str:
    """Spells a count in Lirish: units, "dek" (10), "dek"+unit (11-19), "dudek" (20).

    Args:
        value: the count, 2..20.

    Returns:
        The Lirish word.

    Raises:
        ValueError: value is outside 2..20.
    """
    if not MIN_NUMBER <= value <= MAX_NUMBER:
        raise ValueError(f"number={value} is outside {MIN_NUMBER}..{MAX_NUMBER}; use a count in that range")
    if value < 10:
        return _UNITS_LI[value]
    if value == 20:
        return "dudek"
    return "dek" + _UNITS_LI.get(value - 10, "")


@dataclass(frozen=True)
class NounPhrase:
    """English noun phrase: [det] [number] [adj] noun.

    Attributes:
        noun: a key of NOUNS.
        plural: the plural form.
        det: "the", "a" (written "an" before a vowel) or None (bare plural).
        adj: a key of ADJECTIVES, or None.
        number: a count (plural only), or None.
        digits: write the number as a digit, else as a word (2..12 only).

    Raises:
        ValueError: an unknown word or an ungrammatical combination.
    """

    noun: str
    plural: bool = False
    det: str | None = "the"
    adj: str | None = None
    number: int | None = None
    digits: bool = False

    def __post_init__(self) -> None:
        if self.noun not in NOUNS:
            raise ValueError(f"noun={self.noun!r} is not in the vocabulary; use one of NOUNS")
        if self.adj is not None and self.adj not in ADJECTIVES:
            raise ValueError(f"adj={self.adj!r} is not in the vocabulary; use one of ADJECTIVES or None")
        if self.det not in (None, *DETERMINERS):
            raise ValueError(f"det={self.det!r} is not a determiner; use 'the', 'a' or None")
        if not self.plural and self.det is None:
            # English count nouns need a determiner in the singular ("dog sees" is not English).
            raise ValueError(f"singular noun {self.noun!r} needs det='the' or 'a'")
        if self.plural and self.det == "a":
            raise ValueError(f"det='a' with a plural noun {self.noun!r}; use 'the' or None")
        if self.number is not None:
            if not self.plural:
                raise ValueError(f"number={self.number} needs plural=True")
            lirish_number(self.number)  # range check
            if not self.digits and self.number not in NUMBER_WORDS_EN:
                raise ValueError(
                    f"number={self.number} has no English word here (limit {max(NUMBER_WORDS_EN)}); "
                    "pass digits=True"
                )


@dataclass(frozen=True)
class PrepPhrase:
    """English prepositional phrase ("in the house"); Lirish puts the postposition after it.

    Attributes:
        prep: a key of PREPOSITIONS.
        np: the noun phrase.

    Raises:
        ValueError: an unknown preposition.
    """

    prep: str
    np: NounPhrase

    def __post_init__(self) -> None:
        if self.prep not in PREPOSITIONS:
            raise ValueError(f"prep={self.prep!r} is not in the vocabulary; use one of PREPOSITIONS")


@dataclass(frozen=True)
class Clause:
    """One sentence: subject verb [object] [prepositional phrase], present or past.

    Attributes:
        subject: the subject.
        verb: a key of VERBS (base form).
        obj: the object (transitive verbs only), or None.
        past: past tense, else present.
        pp: a prepositional phrase, or None.

    Raises:
        ValueError: an unknown verb, or an object missing on a transitive verb or present on an
            intransitive one.
    """

    subject: NounPhrase
    verb: str
    obj: NounPhrase | None = None
    past: bool = False
    pp: PrepPhrase | None = None

    def __post_init__(self) -> None:
        if self.verb not in VERBS:
            raise ValueError(f"verb={self.verb!r} is not in the vocabulary; use one of VERBS")
        if (self.verb in TRANSITIVE_VERBS) != (self.obj is not None):
            kind = "transitive" if self.verb in TRANSITIVE_VERBS else "intransitive"
            raise ValueError(
                f"verb={self.verb!r} is {kind}; {'give' if kind == 'transitive' else 'drop'} the object"
            )


def _english_np(np: NounPhrase) -> list[str]:
    plural, _ = NOUNS[np.noun]
    words: list[str] = []
    if np.number is not None:
        words.append(str(np.number) if np.digits else NUMBER_WORDS_EN[np.number])
    if np.adj is not None:
        words.append(np.adj)
    words.append(plural if np.plural else np.noun)
    if np.det == "a":
        return ["an" if words[0][0] in "aeio" else "a", *words]
    return ([np.det] if np.det else []) + words


def _lirish_np(np: NounPhrase) -> list[str]:
    words = [DETERMINERS[np.det]] if np.det else []
    words.append(NOUNS[np.noun][1] + (NOUN_PLURAL if np.plural else ""))
    if np.adj is not None:
        words.append(ADJECTIVES[np.adj] + (ADJ_PLURAL if np.plural else ""))
    if np.number is not None:
        words.append(lirish_number(np.number))
    return words


def english(clause: Clause) -> str:
    """Writes the English sentence for clause (SVO, verb agreeing with the subject).

    Args:
        clause: the sentence.

    Returns:
        Lowercase words separated by single spaces.
    """
    third_sg, past, _ = VERBS[clause.verb]
    verb = past if clause.past else (clause.verb if clause.subject.plural else third_sg)
    words = _english_np(clause.subject) + [verb]
    if clause.obj is not None:
        words += _english_np(clause.obj)
    if clause.pp is not None:
        words += [clause.pp.prep, *_english_np(clause.pp.np)]
    return " ".join(words)


def translate(clause: Clause) -> str:
    """Writes the Lirish sentence for clause: subject object [np postposition] verb+tense+number.

    Args:
        clause: the sentence.

    Returns:
        Lowercase words separated by single spaces.
    """
    words = _lirish_np(clause.subject)
    if clause.obj is not None:
        words += _lirish_np(clause.obj)
    if clause.pp is not None:
        words += [*_lirish_np(clause.pp.np), PREPOSITIONS[clause.pp.prep]]
    stem = VERBS[clause.verb][2]
    words.append(stem + TENSE_SUFFIX[clause.past] + NUMBER_SUFFIX[clause.subject.plural])
    return " ".join(words)


_ANIMATE_KEYS = tuple(ANIMATE_NOUNS)
_NOUN_KEYS = tuple(NOUNS)
_ADJ_KEYS = tuple(ADJECTIVES)
_TRANSITIVE_KEYS = tuple(TRANSITIVE_VERBS)
_INTRANSITIVE_KEYS = tuple(INTRANSITIVE_VERBS)
_PREP_KEYS = tuple(PREPOSITIONS)


def _sample_np(rng: random.Random, nouns: tuple[str, ...], allow_number: bool = True) -> NounPhrase:
    noun = rng.choice(nouns)
    adj = rng.choice(_ADJ_KEYS) if rng.random() < 0.5 else None
    if rng.random() < 0.5:
        return NounPhrase(noun, plural=False, det=rng.choice(("the", "a")), adj=adj)
    number, digits = None, False
    if allow_number and rng.random() < 0.5:
        digits = rng.random() < 0.3
        number = rng.randint(MIN_NUMBER, MAX_NUMBER if digits else max(NUMBER_WORDS_EN))
    return NounPhrase(noun, plural=True, det=rng.choice(("the", None)), adj=adj, number=number, digits=digits)


def sample_clause(rng: random.Random) -> Clause:
    """Draws one random clause (3-13 English words) using only rng.

    Args:
        rng: the random generator.

    Returns:
        The clause.
    """
    subject = _sample_np(rng, _ANIMATE_KEYS)
    past = rng.random() < 0.4
    transitive = rng.random() < 0.8
    # Intransitive clauses always get a place so that no sentence is shorter than 3 words.
    with_pp = not transitive or rng.random() < 0.3
    pp = (
        PrepPhrase(rng.choice(_PREP_KEYS), _sample_np(rng, PLACE_NOUNS, allow_number=False))
        if with_pp
        else None
    )
    if transitive:
        return Clause(subject, rng.choice(_TRANSITIVE_KEYS), _sample_np(rng, _NOUN_KEYS), past, pp)
    return Clause(subject, rng.choice(_INTRANSITIVE_KEYS), None, past, pp)


def generate_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Generates n distinct (English, Lirish) pairs, the same for the same (n, seed).

    Args:
        n: the number of pairs.
        seed: the seed of the generator (never the global one).

    Returns:
        The pairs.

    Raises:
        ValueError: n is negative or above MAX_PAIRS.
    """
    if not 0 <= n <= MAX_PAIRS:
        raise ValueError(f"n={n} is outside 0..{MAX_PAIRS}; ask for at most MAX_PAIRS pairs")
    rng = random.Random(seed)  # never the global generator, so other code cannot shift the corpus
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    # Duplicates are rare (the space is ~1e12), so this bound is only a guard against a bug.
    for _ in range(20 * n + 1000):
        if len(pairs) == n:
            break
        clause = sample_clause(rng)
        source = english(clause)
        if source not in seen:  # the translation is a function of the source, so dedupe on it
            seen.add(source)
            pairs.append((source, translate(clause)))
    if len(pairs) < n:
        raise ValueError(f"n={n}: only {len(pairs)} distinct pairs could be drawn; ask for fewer")
    return pairs


def write_corpus(path: str | os.PathLike[str], n: int, seed: int = 0) -> Path:
    """Writes generate_pairs(n, seed) as UTF-8 'source<TAB>target' lines.

    The file is written to a temporary file in the same directory and renamed into place,
    so a reader never sees half a corpus.

    Args:
        path: the file to write.
        n: the number of pairs.
        seed: the generator's seed.

    Returns:
        The path.

    Raises:
        ValueError: as generate_pairs does.
        atomic.OutputError: the directory cannot be written (a ValueError too).
    """
    path = Path(path)
    text = "".join(f"{src}\t{tgt}\n" for src, tgt in generate_pairs(n, seed))
    atomic.write_file(path, text)
    return path
