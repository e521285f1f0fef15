"""Every computation-changing config field of Marian, M2M100 and mBART, honoured or refused by name
(issue 35, item 8).

Honoured: a tiny random model with the field set away from the fixtures' value is exported and held to
generate() by export/hf/verify.py (source ids, teacher-forced log-probabilities, greedy and beam 4 ids,
texts), and the bundle records what it read. Refused: the export stops in one line naming the field.
docs/hf-config-flags.md lists each field with what the importer does and the test here that shows it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
import hf_mbart as M  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.family import NEUTRAL_GENERATION, families  # noqa: E402
from seq2onnx.export.hf.read import HFImportError, read_config  # noqa: E402
from seq2onnx.export.hf.verify import verify_hf  # noqa: E402

SENTENCES = 8
LEGACY = (
    "normalize_before",
    "normalize_embedding",
    "static_position_embeddings",
    "add_final_layer_norm",
    "add_bias_logits",
)


def _random(family: str) -> Path:
    if family == "m2m100-trained":  # sensible outputs: a random M2M100 generates made-up rows, which decode
        return F.cached_model("m2m100")  # as "<unk>" in transformers and " ⁇ " here (docs/hf-config-flags.md)
    return M.cached_mbart(train_steps=0) if family == "mbart" else F.random_model(family)


def _copy(tmp_path: Path, family: str) -> Path:
    directory = tmp_path / "model"
    shutil.copytree(_random(family), directory)
    return directory


def _edit(path: Path, **fields) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data.update(fields)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _resave(directory: Path, change) -> None:
    """Loads the model, lets `change(model)` alter it and its config, and saves it over itself (weights
    included)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(str(directory), dtype=torch.float32)
    torch.manual_seed(1)
    change(model)
    with F._quiet_transformers():
        model.save_pretrained(directory)


def _untie(model) -> None:
    """tie_word_embeddings false, as transformers 5 builds such a model: the output projection and the
    encoder's and decoder's tables are tensors of their own (here copies of the shared table, the
    projection near it)."""
    import torch

    model.config.tie_word_embeddings = False
    shared = model.get_input_embeddings().weight.detach()
    for stack in (model.get_encoder(), model.get_decoder()):
        stack.embed_tokens = torch.nn.Embedding.from_pretrained(
            shared.clone(), freeze=False, padding_idx=model.config.pad_token_id
        )
    model.lm_head = torch.nn.Linear(model.config.d_model, model.config.vocab_size, bias=False)
    with (
        torch.no_grad()
    ):  # near the shared table, so that a trained model stays trained, but a tensor of its own
        model.lm_head.weight.copy_(shared + 0.05 * torch.randn_like(shared))


@pytest.mark.slow
def test_weights_missing_for_the_config_are_refused(tmp_path):
    """A checkpoint saved tied, whose config.json then says tie_word_embeddings false: transformers 5
    unties the encoder's and decoder's tables too and fills them at random at each load; refused,
    naming them."""
    directory = _copy(tmp_path, "m2m100")
    _edit(directory / "config.json", tie_word_embeddings=False)
    with pytest.raises(HFImportError, match=r"the weights lack \d+ tensors .*embed_tokens"):
        export_hf_bundle(directory, tmp_path / "bundle", decoder="standard")
    assert not (tmp_path / "bundle").exists()


def _one_decoder_layer(model) -> None:
    model.model.decoder.layers = model.model.decoder.layers[:1]
    model.config.decoder_layers = 1


# (family, how the copy is changed, bundle.json's model fields that show the field was read)
HONOURED = {
    "marian-scale_embedding-false": ("marian", {"scale_embedding": False}, {"scale_embedding": False}),
    "mbart-scale_embedding-false": ("mbart", {"scale_embedding": False}, {"scale_embedding": False}),
    "marian-activation-gelu": ("marian", {"activation_function": "gelu"}, {"activation": "gelu"}),
    "m2m100-activation-silu": ("m2m100", {"activation_function": "silu"}, {"activation": "swish"}),
    "mbart-activation-relu": ("mbart", {"activation_function": "relu"}, {"activation": "relu"}),
    # generate() runs in eval mode: dropout and layerdrop change nothing, in transformers or here
    "marian-dropout-layerdrop": (
        "marian",
        {
            "dropout": 0.3,
            "attention_dropout": 0.3,
            "activation_dropout": 0.3,
            "encoder_layerdrop": 0.5,
            "decoder_layerdrop": 0.5,
        },
        {"dropout": 0.0},
    ),
    "m2m100-tie_word_embeddings-false": ("m2m100-trained", _untie, {"tie_embeddings": False}),
    "mbart-tie_word_embeddings-false": ("mbart", _untie, {"tie_embeddings": False}),
    "m2m100-decoder_layers-1": ("m2m100", _one_decoder_layer, {"n_encoder_layers": 2, "n_decoder_layers": 1}),
}


@pytest.fixture(scope="module")
def sentences_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("flags") / "sentences.txt"
    path.write_text("\n".join(F.test_sentences(SENTENCES)) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("case", list(HONOURED))
def test_honoured_against_generate(tmp_path, sentences_file, case):
    family, change, shown = HONOURED[case]
    directory = _copy(tmp_path, family)
    if callable(change):
        _resave(directory, change)
    else:
        _edit(directory / "config.json", **change)
    bundle = export_hf_bundle(directory, tmp_path / "bundle", decoder="standard")
    model = json.loads((bundle / "bundle.json").read_text())["model"]
    assert {k: model[k] for k in shown} == shown
    options = (
        {"source_lang": "en_XX", "target_lang": "fr_XX"}
        if family == "mbart"
        else {"source_lang": "en", "target_lang": "fr"}
        if family.startswith("m2m100")
        else {}
    )
    report = verify_hf(
        directory, bundle, data=str(sentences_file), sentences=SENTENCES, tensor_sentences=2, **options
    )
    failed = [
        (c["name"], c["value"], c["bound"]) for c in report["checks"] if c["judged"] and not c["passed"]
    ]
    assert report["passed"], failed
    [greedy] = [c for c in report["checks"] if c["name"] == "greedy ids identical to generate()"]
    assert greedy["value"] == 1.0


@pytest.mark.slow
def test_flip_changes_the_output(tmp_path):
    """The honoured cases could fail: the same weights with scale_embedding flipped give other
    log-probabilities."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    directory = _copy(tmp_path, "marian")
    ids = torch.tensor([[5, 6, 7, 0]])
    start = torch.tensor([[json.loads((directory / "config.json").read_text())["decoder_start_token_id"]]])
    before = AutoModelForSeq2SeqLM.from_pretrained(str(directory))(
        input_ids=ids, decoder_input_ids=start
    ).logits
    _edit(directory / "config.json", scale_embedding=False)
    after = AutoModelForSeq2SeqLM.from_pretrained(str(directory))(
        input_ids=ids, decoder_input_ids=start
    ).logits
    assert (before - after).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["marian", "m2m100", "mbart"])
@pytest.mark.parametrize("field", LEGACY)
def test_fields_transformers_never_reads_are_refused_unless_computed(tmp_path, family, field):
    cls = families()[{"m2m100": "m2m_100"}.get(family, family)]
    computed = cls.fixed[field]
    directory = _copy(tmp_path, family)
    _edit(directory / "config.json", **{field: computed})
    read_config(directory)  # the value transformers computes is accepted
    _edit(directory / "config.json", **{field: not computed})
    with pytest.raises(
        HFImportError,
        match=rf"config\.json: {field} is {not computed!r}, but transformers' .* "
        rf"computes {field}={computed!r}",
    ) as e:
        read_config(directory)
    assert "\n" not in str(e.value)


BAD_GENERATION = {
    "do_sample": True,
    "num_beam_groups": 2,
    "diversity_penalty": 0.5,
    "repetition_penalty": 1.2,
    "no_repeat_ngram_size": 3,
    "encoder_no_repeat_ngram_size": 2,
    "encoder_repetition_penalty": 1.1,
    "exponential_decay_length_penalty": [5, 1.1],
    "sequence_bias": [[[5], 1.0]],
    "begin_suppress_tokens": [5],
    "max_new_tokens": 10,
    "min_new_tokens": 2,
    "forced_decoder_ids": [[1, 5]],
    "force_words_ids": [[5]],
    "constraints": [{"token_ids": [5]}],
}


def test_every_refused_generation_field_has_a_case():
    assert set(BAD_GENERATION) == set(NEUTRAL_GENERATION)


@pytest.mark.parametrize("field", list(BAD_GENERATION))
def test_generation_fields_no_host_emulates_are_refused(tmp_path, field):
    directory = _copy(tmp_path, "marian")
    _edit(directory / "generation_config.json", **{field: NEUTRAL_GENERATION[field]})
    read_config(directory)  # the neutral value is accepted
    _edit(directory / "generation_config.json", **{field: BAD_GENERATION[field]})
    with pytest.raises(HFImportError, match=rf"generation_config\.json: {field} is .*not emulated"):
        read_config(directory)


def test_generation_field_in_config_json_is_refused_where_generation_config_is_silent(tmp_path):
    directory = _copy(tmp_path, "m2m100")
    _edit(directory / "config.json", no_repeat_ngram_size=3)
    with pytest.raises(HFImportError, match=r"config\.json: no_repeat_ngram_size is 3"):
        read_config(directory)
    _edit(directory / "generation_config.json", no_repeat_ngram_size=0)  # generate() takes this one
    read_config(directory)


@pytest.mark.parametrize("activation", ["gelu_new", "quick_gelu", "tanh", "gelu_pytorch_tanh"])
def test_activation_we_cannot_run_is_refused_by_name(tmp_path, activation):
    directory = _copy(tmp_path, "mbart")
    _edit(directory / "config.json", activation_function=activation)
    with pytest.raises(HFImportError, match=rf"activation_function is '{activation}'"):
        read_config(directory)


def test_unknown_model_type_names_every_family(tmp_path):
    directory = _copy(tmp_path, "marian")
    _edit(directory / "config.json", model_type="bart")
    with pytest.raises(HFImportError, match=r"model_type 'bart' is not supported") as e:
        read_config(directory)
    for family in ("marian (Marian", "m2m_100 (M2M100", "mbart (mBART-50)"):
        assert family in str(e.value)
