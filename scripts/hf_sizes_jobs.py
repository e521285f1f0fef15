"""hf_real_sizes.py's jobs, each a child process of its own (`hf_sizes_jobs.py SPEC`: run_job starts it):
build (a model directory with random weights and trained tokenizers), prepare (the test sentences' ids),
export (our bundle), ct2_convert (CTranslate2's converter), engine (one engine's rows, timed)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hf_sizes_common import LANGS, M2M_LANGS, M2M_MADEUP, MBART_LANGS, ROWS, GpuMemory
from hf_sizes_common import dir_bytes, english_corpus, memory_mb, strip, write_json


# --------------------------------------------------------------------------------------------- build
def train_spm(texts: list[str], path: Path, pieces: int, total: int) -> list[str]:
    """A unigram model trained on texts (up to `pieces` pieces), then unused filler pieces appended (score far
    below every trained piece, text that never occurs) up to `total` pieces; writes it to path, returns its
    pieces."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    import hf_fixtures as F

    F.train_spm(texts, path, pieces, hard_vocab_limit=False, num_threads=2)
    proto = pb.ModelProto()
    proto.ParseFromString(path.read_bytes())
    low = min(p.score for p in proto.pieces) - 10.0
    for i in range(total - len(proto.pieces)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"\u2581qqfill{i:06d}", low, pb.ModelProto.SentencePiece.NORMAL
    path.write_bytes(proto.SerializeToString())
    return [p.piece for p in proto.pieces]


def job_build(spec: dict) -> dict:
    """A model directory: random (seeded) weights of the size asked, its tokenizer trained on English."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    s, out = spec["size"], Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    texts, origin = english_corpus()
    texts = texts[: spec.get("max_texts") or len(texts)]  # tiny pieces need fewer (--tiny)
    d, L, H, F = s["d"], s["layers"], s["heads"], s["ffn"]
    shape = dict(
        d_model=d, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H, scale_embedding=True
    )
    shape.update(decoder_attention_heads=H, encoder_ffn_dim=F, decoder_ffn_dim=F)
    torch.manual_seed(spec.get("seed", 0))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # hf_fixtures.conventions
    import hf_fixtures as F  # the published conventions, one source with the tests

    build = {"marian": _build_marian, "mbart": _build_mbart}.get(s["family"], _build_m2m100)
    tok, model_class, published = build(s, out, texts)
    config, generation = F.conventions(s["family"], shape, s["vocab"], **published)
    model = model_class(config)
    model.generation_config = generation
    params = sum(p.numel() for p in model.parameters())
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"parameters": params, "spm_trained_on": origin}


# Each builder trains the family's tokenizer into out and returns (tokenizer, model class, the published
# config's values for hf_fixtures.conventions).
def _build_marian(s: dict, out: Path, texts: list[str]):
    """An OPUS-MT Marian: its vocab.json, two SentencePiece models."""
    from transformers import MarianMTModel, MarianTokenizer

    V = s["vocab"]
    # vocab.json: </s> 0, <unk> 1, the ordinary pieces, <pad> last; SentencePiece adds <unk> <s> </s> of its
    # own
    pieces = train_spm(texts, out / "source.spm", s["spm"], V - 2 - 1 + 3)
    (out / "target.spm").write_bytes((out / "source.spm").read_bytes())
    vocab = {t: i for i, t in enumerate(["</s>", "<unk>"] + sorted(pieces[3:]) + ["<pad>"])}
    assert len(vocab) == V, (len(vocab), V)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    files = dict(source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"))
    files["vocab"] = str(out / "vocab.json")
    tok = MarianTokenizer(**files, source_lang="en", target_lang="fr", model_max_length=512)
    return tok, MarianMTModel, dict(max_length=512, max_position_embeddings=512)


def _build_mbart(s: dict, out: Path, texts: list[str]):
    """An mBART-50 many-to-many: MBart50Tokenizer's layout, en_XX first."""
    from transformers import MBart50Tokenizer, MBartForConditionalGeneration

    V = s["vocab"]
    # MBart50Tokenizer's ids: <s> <pad> </s> <unk>, the pieces but SentencePiece's own three, 52 codes,
    # <mask>
    train_spm(texts, out / "sentencepiece.bpe.model", s["spm"], V - 4 - MBART_LANGS - 1 + 3)
    # bos_token as the published special_tokens_map.json has it (CTranslate2's converter reads it)
    tok = MBart50Tokenizer.from_pretrained(str(out), src_lang="en_XX", bos_token="<s>")
    assert len(tok) == V, (len(tok), V)
    published = dict(max_length=200, max_position_embeddings=1024, tokenizer_class="MBart50Tokenizer")
    return tok, MBartForConditionalGeneration, published


def _build_m2m100(s: dict, out: Path, texts: list[str]):
    """An M2M100 (NLLB's size): M2M100Tokenizer's layout and language tokens."""
    from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    V = s["vocab"]
    languages = FAIRSEQ_LANGUAGE_CODES["m2m100"]
    assert len(languages) == M2M_LANGS
    n_vocab = V - M2M_LANGS - M2M_MADEUP  # vocab.json: <s> <pad> </s> <unk>, then the pieces
    pieces = train_spm(texts, out / "sentencepiece.bpe.model", s["spm"], n_vocab - 4 + 3)
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + sorted(pieces[3:]))}
    assert len(vocab) == n_vocab, (len(vocab), n_vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    files = dict(vocab_file=str(out / "vocab.json"), spm_file=str(out / "sentencepiece.bpe.model"))
    codes = [f"__{c}__" for c in languages]
    langs = dict(src_lang="en", tgt_lang="fr", num_madeup_words=M2M_MADEUP, additional_special_tokens=codes)
    tok = M2M100Tokenizer(**files, **langs, model_max_length=1024)
    tok.tgt_lang = None
    return tok, M2M100ForConditionalGeneration, dict(max_length=200, max_position_embeddings=1024)


# -------------------------------------------------------------------------------------------- prepare
def job_prepare(spec: dict) -> dict:
    """Source ids and pieces of the test sentences as the directory's tokenizer makes them, and its id ->
    token table."""
    import warnings

    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sacremoses.*")
        tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    config = json.loads((Path(spec["model_dir"]) / "config.json").read_text())
    V = config["vocab_size"]
    m2m = config["model_type"] == "m2m_100"
    source_lang, forced_token, target_lang = LANGS.get(config["model_type"], (None, None, None))
    if source_lang:
        tok.src_lang = source_lang
    sentences = spec["sentences"]
    ids = [tok(s).input_ids for s in sentences]
    table = tok.convert_ids_to_tokens(list(range(V)))
    # CTranslate2 names the made-up rows madeupword0.. (its M2M100 loader); the tokenizer calls them <unk>
    if m2m:
        for k in range(M2M_MADEUP):
            table[V - M2M_MADEUP + k] = f"madeupword{k}"
    Path(spec["vocab_out"]).write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    return {
        "sentences": sentences,
        "source_ids": ids,
        "source_tokens": [tok.convert_ids_to_tokens(x) for x in ids],
        "eos": config["eos_token_id"],
        "pad": config["pad_token_id"],
        "start": config["decoder_start_token_id"],
        "forced_id": tok.convert_tokens_to_ids(forced_token) if forced_token else None,
        "forced_token": forced_token,
        "target_lang": target_lang,
        "source_lens": [len(x) for x in ids],
    }


# --------------------------------------------------------------------------------------------- export
def job_export(spec: dict) -> dict:
    import torch  # noqa: F401  (imports before the clock and the baseline)

    from seq2onnx.export.hf.bundle import export_hf_bundle

    base = memory_mb()["rss_mb"]
    t = time.perf_counter()
    options = {k: spec.get(k) for k in ("quantize", "table_bits")} | {"dtype": spec.get("dtype", "float32")}
    export_hf_bundle(spec["model_dir"], spec["out"], force=True, **options)
    seconds = time.perf_counter() - t
    files = {p.name: p.stat().st_size for p in Path(spec["out"]).iterdir() if p.suffix in (".onnx", ".bin")}
    out = {"seconds": seconds, "rss_after_imports_mb": base, "bytes": dir_bytes(Path(spec["out"]))}
    return out | {"graph_and_weights_bytes": files}


def job_ct2_convert(spec: dict) -> dict:
    import ctranslate2  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from ctranslate2.converters import TransformersConverter

    base = memory_mb()["rss_mb"]
    t = time.perf_counter()
    TransformersConverter(spec["model_dir"]).convert(spec["out"], quantization=None, force=True)
    seconds = time.perf_counter() - t
    out = {"seconds": seconds, "rss_after_imports_mb": base, "bytes": dir_bytes(Path(spec["out"]))}
    out["model_bin_bytes"] = (Path(spec["out"]) / "model.bin").stat().st_size
    if spec.get("int8", True):
        # the anchor of an int8 bundle's size: CTranslate2's own converter with quantization="int8"
        TransformersConverter(spec["model_dir"]).convert(
            spec["out"] + "-int8", quantization="int8", force=True
        )
        out["int8_model_bin_bytes"] = (Path(spec["out"] + "-int8") / "model.bin").stat().st_size
    return out


# --------------------------------------------------------------------------------------------- engines
def _torch_decoder(spec: dict, prep: dict):
    """transformers' generate() on spec's device ("cpu" or "cuda") in spec's dtype (float32 or float16)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(spec["threads"])
    # The fp32 reference computes in full float32: no TF32 in cuBLAS or cuDNN (the child's environment also
    # sets NVIDIA_TF32_OVERRIDE=0 on the GPU).
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    device, L = spec.get("device", "cpu"), spec["max_new_tokens"]
    dtype = getattr(torch, spec.get("dtype", "float32"))
    model = AutoModelForSeq2SeqLM.from_pretrained(spec["model_dir"], dtype=dtype).to(device).eval()
    eos, pad = prep["eos"], prep["pad"]
    extra = {"forced_bos_token_id": prep["forced_id"]} if prep["forced_id"] is not None else {}
    # transformers forces </s> as the last token at max_length where generation_config says
    # forced_eos_token_id (OPUS-MT: 0); imported bundles do too (decoding.forced_eos), CTranslate2 does not.

    def decode(idx, beam):
        srcs = [prep["source_ids"][i] for i in idx]
        n = max(map(len, srcs))
        ids = torch.tensor([s + [pad] * (n - len(s)) for s in srcs], device=device)
        mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in srcs], device=device)
        opts = dict(early_stopping=True, length_penalty=1.0) if beam > 1 else {}
        with torch.inference_mode():
            search = dict(num_beams=beam, do_sample=False, max_length=L + 1, min_length=0, **opts, **extra)
            out = model.generate(input_ids=ids, attention_mask=mask, **search)
        return [strip(r, eos, pad) for r in out.tolist()]  # .tolist() waits for the device

    return decode, str(dtype).replace("torch.", "")


def _ours_decoder(spec: dict, prep: dict):
    """Our runtime on spec's device; spec["tuning"] (SessionTuning's fields) picks a variant to A/B."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    tuning = SessionTuning(**spec.get("tuning", {}))
    tr = Translator(
        spec["bundle"], device=spec.get("device", "cpu"), intra_threads=spec["threads"], _tuning=tuning
    )
    extra = {"target_lang": prep.get("target_lang", "fr")} if prep["forced_id"] is not None else {}

    def decode(idx, beam):
        limits = dict(max_decoding_length=spec["max_new_tokens"], min_decoding_length=0, length_penalty=1.0)
        srcs, batch = [prep["source_ids"][i] for i in idx], spec.get("max_batch", 32)
        res = tr.translate_batch(srcs, beam_size=beam, **limits, max_batch_size=batch, **extra)
        return [list(r.token_ids[0]) for r in res]

    return decode, f"{tr.device}, {tr.decoder_variant} decoder"


def _ct2_decoder(spec: dict, prep: dict):
    """CTranslate2 on spec's device at spec's compute_type (it converts a type the device lacks: the effective
    one is returned)."""
    import ctranslate2

    device = spec.get("device", "cpu")
    threads = spec["threads"] if device == "cpu" else 1
    kinds = dict(device=device, compute_type=spec["compute_type"])
    tr = ctranslate2.Translator(spec["ct2_dir"], **kinds, intra_threads=threads, inter_threads=1)
    forced = prep["forced_token"]

    def decode(idx, beam):
        # CTranslate2's max_decoding_length counts the target prefix (the forced __fr__), as ours and
        # transformers' max_length - 1 do (checked on --tiny: all three give 32 tokens, __fr__ included).
        extra = {"target_prefix": [[forced]] * len(idx)} if forced else {}
        limits = dict(max_decoding_length=spec["max_new_tokens"], min_decoding_length=0, length_penalty=1.0)
        srcs, batch = [prep["source_tokens"][i] for i in idx], spec.get("max_batch", 32)
        res = tr.translate_batch(
            srcs, beam_size=beam, **limits, max_batch_size=batch, return_scores=False, **extra
        )
        return [r.hypotheses[0] for r in res]

    return decode, getattr(tr, "compute_type", spec["compute_type"])


def _decoder(spec: dict, prep: dict):
    """(RSS after imports MB, load seconds, decode(indices, beam) -> list of outputs: id lists, or token lists
    for CTranslate2, and what ran: the dtype, provider or compute type)."""
    engine = spec["engine"]
    if engine == "torch":
        import torch  # noqa: F401  (imports before the clock and the baseline)
        import transformers  # noqa: F401
    elif engine == "ours":
        from seq2onnx.runtime import translator  # noqa: F401
    else:
        import ctranslate2  # noqa: F401
    base = memory_mb()["rss_mb"]
    t = time.perf_counter()
    make = {"torch": _torch_decoder, "ours": _ours_decoder}.get(engine, _ct2_decoder)
    decode, ran = make(spec, prep)
    return base, time.perf_counter() - t, decode, ran


def _order(n: int, batch: int, batch1: int) -> list[list[int]]:
    """A row's batches: the first batch1 sentences one at a time at batch 1, else all n in batches."""
    order = list(range(min(batch1, n))) if batch == 1 else list(range(n))
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def job_engine(spec: dict) -> dict:
    """One engine over spec's rows ([search, beam, batch]; default ROWS): tokens/s, outputs, memory, load.

    The result so far is written to RESULT.partial after every row, so that a job killed at its time limit
    still gives the rows it finished.
    """
    prep = json.loads(Path(spec["prepared"]).read_text(encoding="utf-8"))
    gpu = GpuMemory()
    base, load_s, decode, ran = _decoder(spec, prep)
    out = {
        "load_s": load_s,
        "ran": ran,
        "rss_after_imports_mb": base,
        "rss_after_load_mb": memory_mb()["rss_mb"],
    }
    out |= {"gpu_after_load_mb": gpu.now_mb(), "rows": {}}
    n, L = len(prep["source_ids"]), spec["max_new_tokens"]
    for search, beam, batch in spec.get("rows", ROWS):
        name = f"{search} b{batch}"
        batches = _order(n, batch, spec["batch1_sentences"])
        decode(batches[0], beam)  # warm-up
        t = time.perf_counter()
        outputs = []
        for b in batches:
            outputs += decode(b, beam)
        seconds = time.perf_counter() - t
        tokens = sum(min(len(o) + 1, L) for o in outputs)  # + the end token, unless the limit cut the output
        row = {"seconds": seconds, "tokens": tokens, "sentences": sum(map(len, batches)), "outputs": outputs}
        out["rows"][name] = row
        out["gpu_peak_mb"] = gpu.peak_mb()
        write_json(Path(spec["result"] + ".partial"), out | memory_mb())
        rate = f"{tokens / seconds:.1f} tokens/s ({seconds:.2f} s)"
        print(f"  {spec['label']}: {name}: {rate}", file=sys.stderr, flush=True)
    gpu.close()
    return out


JOBS = dict(
    build=job_build, prepare=job_prepare, export=job_export, ct2_convert=job_ct2_convert, engine=job_engine
)


def child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    result = JOBS[spec["job"]](spec)
    result.update(memory_mb())
    write_json(Path(spec["result"]), result)


if __name__ == "__main__":
    child_main(sys.argv[1])
