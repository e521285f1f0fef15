"""spec/capabilities.json from the Python side: translate_batch takes exactly the options the table gives
the Python host, every option names shared cases that exist or a gap whose test files exist, the shared
sampling cases (spec/cases/sampling.json, also run by js/test/sampling.test.mjs) give their tokens here,
and the Node host samples the tiny model's sentences exactly as this runtime does (that part needs Node:
it skips without it)."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from seq2onnx.runtime.sampling import _uniform, sample
from seq2onnx.runtime.translator import Translator
from node_host import NODE, skip_reason

ROOT = Path(__file__).resolve().parents[1]
TABLE = json.loads((ROOT / "spec" / "capabilities.json").read_text(encoding="utf-8"))
SAMPLING = json.loads((ROOT / "spec" / "cases" / "sampling.json").read_text(encoding="utf-8"))
OPTIONS = TABLE["options"]


def test_translate_batch_takes_exactly_the_python_options():
    params = inspect.signature(Translator.translate_batch).parameters.values()
    taken = {p.name for p in params if p.kind == p.KEYWORD_ONLY}
    assert taken == {name for name, o in OPTIONS.items() if o["hosts"]["python"] is True}


def test_every_host_of_every_option_is_supported_or_says_why():
    for name, o in OPTIONS.items():
        assert set(o["hosts"]) == set(TABLE["hosts"]), name
        for host, value in o["hosts"].items():
            assert value is True or (isinstance(value, str) and len(value) > 10), (
                f"{name} on {host}: true or the reason"
            )


def test_every_option_has_shared_cases_or_a_gap_naming_where_each_host_tests_it():
    for name, o in OPTIONS.items():
        for ref in o["cases"]:
            file, field = ref.split(":")
            cases = json.loads((ROOT / "spec" / "cases" / file).read_text(encoding="utf-8"))["cases"]
            assert any(field in c for c in cases), f"{name}: no case of {file} has {field}"
        if o["cases"]:
            continue
        files = re.findall(r"(?:tests|js/test|js/web)/[\w.-]+", o.get("gap", ""))
        assert any(f.startswith("tests/") for f in files) and any(f.startswith("js/") for f in files), name
        for f in files:
            word = name if f.endswith(".py") else o["js"]  # each language's name of the option
            assert word in (ROOT / f).read_text(encoding="utf-8"), f"{name}: {f} never mentions {word}"


class Fake:
    """sampling.json's fake decoder: row (s, p) is base[(s + len(p) + sum(p)) % len(base)]."""

    def __init__(self, sentences: list[int]):
        self.sentences = sentences

    def step(self, tokens, cache_indices, t, keep):
        if t == 0:
            self.alive = list(self.sentences)
            self.rows = [(s, ()) for s in self.alive]
        else:
            if keep is not None:
                self.alive = [self.alive[k] for k in keep]
            self.rows = [
                (self.rows[c][0], self.rows[c][1] + (int(tok),))
                for c, tok in zip(cache_indices, tokens[:, 0])
            ]
        base = SAMPLING["base"]
        return np.array([base[(s + len(p) + sum(p)) % len(base)] for s, p in self.rows], dtype=np.float64)


def _options(case: dict, **change) -> dict:
    options = dict(
        start_id=SAMPLING["start_id"],
        eos_id=SAMPLING["end_id"],
        max_lengths=np.array(case["max_lengths"]),
        min_length=case.get("min_length", 0),
        temperature=case["temperature"],
        top_k=case.get("top_k", 0),
        top_p=case.get("top_p", 1.0),
        seed=int(case["seed"]),
        row_keys=case.get("row_keys"),
    )
    return {**options, **change}


def _lacking(case: dict, host: str) -> list[str]:
    """The options this case exercises (the table's sampling.json:FIELD entries) that `host` lacks."""
    used = [
        n
        for n, o in OPTIONS.items()
        if any(r.startswith("sampling.json:") and r.split(":")[1] in case for r in o["cases"])
    ]
    return [n for n in used if OPTIONS[n]["hosts"][host] is not True]


@pytest.mark.parametrize("case", SAMPLING["cases"], ids=lambda c: c["name"])
def test_shared_sampling_cases(case):
    lacking = _lacking(case, "python")
    if lacking:  # the table's gap, by name (today the Python host has every option)
        pytest.skip(f"python lacks {lacking}: {[OPTIONS[n]['hosts']['python'] for n in lacking]}")
    batch = len(case["max_lengths"])
    found = sample(Fake(list(range(batch))).step, batch, **_options(case))
    assert [r.hypotheses[0] for r in found] == [e["tokens"] for e in case["expect"]]
    assert [r.scores[0] for r in found] == [e["score"] for e in case["expect"]]
    for s in range(batch):  # batch invariance: each sentence alone, with its own key
        keys = [case["row_keys"][s] if "row_keys" in case else [s]]
        (alone,) = sample(
            Fake([s]).step, 1, **_options(case, max_lengths=np.array([case["max_lengths"][s]]), row_keys=keys)
        )
        assert alone.hypotheses[0] == case["expect"][s]["tokens"], f"sentence {s} alone"


def test_the_stream_draws():
    for d in SAMPLING["draws"]:
        stream = np.random.SeedSequence([int(d["seed"]), *d["key"]]).generate_state(1, np.uint64)
        assert str(int(stream[0])) == d["stream"]
        assert float(_uniform(stream, d["t"])[0]) == d["u"]


_NODE_SKIP = skip_reason("sampling in the Node host against this runtime")


@pytest.mark.skipif(bool(_NODE_SKIP), reason=_NODE_SKIP)
@pytest.mark.parametrize(
    "flags,options",
    [
        ([], {}),
        (["--sampling-topk", "8", "--min-length", "2"], dict(sampling_topk=8, min_decoding_length=2)),
        (["--sampling-topp", "0.8"], dict(sampling_topp=0.8)),
    ],
)
@pytest.mark.slow
def test_node_samples_as_python_on_the_tiny_model(bundle, flags, options):
    """The real graphs, 60 generated sentences, 3 samples each at temperature 1.5: the same token ids."""
    from seq2onnx.model.corpus import generate_pairs

    sentences = [src for src, _ in generate_pairs(60, seed=11)]
    proc = subprocess.run(
        [
            NODE,
            str(ROOT / "js" / "bin" / "seq2onnx-js.mjs"),
            "translate",
            str(bundle),
            "--json",
            "--threads",
            "1",
            "--sampling-temperature",
            "1.5",
            "--seed",
            "20261126",
            "--n-best",
            "3",
            *flags,
        ],
        input="".join(s + "\n" for s in sentences),
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=ROOT / "js",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line)["token_ids"] for line in proc.stdout.splitlines()]
    translator = Translator(bundle, device="cpu", intra_threads=1)
    want = translator.translate_batch(
        sentences, sampling_temperature=1.5, seed=20261126, num_hypotheses=3, **options
    )
    assert got == [r.token_ids for r in want]
    assert len({tuple(h) for g in got for h in g}) > 60  # the samples vary: the comparison means something
