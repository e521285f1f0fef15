"""Real sizes: Hugging Face Marian and M2M100 models at their published sizes, random weights, imported and timed.

    python benchmarks/hf_real_sizes.py --work DIR [--models marian,nllb] [--sentences 32] [--max-new-tokens 32]
                                       [--threads 2] [--skip-build] [--tiny] [--out DIR] [--repeat R]

Issue 25, item 6 (run once, not in CI). Two model directories are written with transformers' own
save_pretrained, random (seeded) weights from their configs:

- marian: OPUS-MT size (d_model 512, 6+6 layers, 8 heads, ffn 2048, vocabulary 58,101, about 74M
  parameters), OPUS-MT's conventions (</s> 0, <unk> 1, <pad> = decoder start = 58,100, swish, bad_words_ids
  [[58100]], renormalize_logits, forced_eos_token_id 0);
- nllb: NLLB-600M size as an M2M100 (d_model 1024, 12+12 layers, 16 heads, ffn 4096, vocabulary 256,206,
  about 615M parameters; <s> 0 <pad> 1 </s> 2 <unk> 3, decoder start 2, relu), M2M100Tokenizer's layout;
- mbart (asked for by name: --models mbart): mBART-50 many-to-many size (d_model 1024, 12+12 layers, 16 heads,
  ffn 4096, vocabulary 250,054, about 611M parameters; gelu, layernorm_embedding, learned positions),
  MBart50Tokenizer's layout, en_XX -> fr_XX forced (issue 35, item 7).

The tokenizers are a unigram SentencePiece model trained on English (the first column of
../shared/data/tatoeba-cmn-eng/cmn.txt when it exists, CC-BY 2.0 France, tatoeba.org; generated text
otherwise), with unused filler pieces appended so that the SentencePiece model and vocab.json have the
model's whole vocabulary: the embeddings and the output projection have their real sizes.

Each measurement runs in its own child process (this script with --job), so that each has its own peak
resident set (VmHWM, which unlike ru_maxrss does not carry the parent's pages over the exec): our export to
an fp32 and an int8 bundle, CTranslate2's converter (TransformersConverter, fp32; its int8 is the fp32
model loaded with compute_type="int8", as CTranslate2 recommends), and one child per engine translating the
same source ids: PyTorch's model.generate (the reference), ours fp32 and int8, CTranslate2 fp32 and int8 at
intra_threads=THREADS and at 1 (the faster per row is compared, and named). Rows: greedy and beam 4, at
batch 1 (the first 8 sentences, one at a time) and batch 32 (the sentences in batches of 32); each row is
warmed up once (its first batch) and then timed over all its batches. tokens/s = generated target tokens
(the forced language token of M2M100 and the end token included, the decoder start excluded) / seconds.

Results: OUT/report.json (every measurement, every output) and OUT/report.md (the tables), merged with the
other model's results when OUT already holds a report. Model directories are cached under --work.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
TATOEBA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"
BATCH1_SENTENCES = 8
ROWS = [("greedy", 1, 1), ("greedy", 1, 32), ("beam4", 4, 1), ("beam4", 4, 32)]  # (search, beam, batch)
M2M_LANGS, M2M_MADEUP = 100, 8  # M2M100Tokenizer's language tokens and num_madeup_words after vocab.json

SIZES = {  # family, d_model, layers (each side), heads, ffn, vocabulary, SentencePiece pieces trained
    "marian": dict(family="marian", d=512, layers=6, heads=8, ffn=2048, vocab=58101, spm=8000),
    "nllb": dict(family="m2m100", d=1024, layers=12, heads=16, ffn=4096, vocab=256206, spm=8000),
    # mBART-50 many-to-many (facebook/mbart-large-50-many-to-many-mmt): about 611M parameters
    "mbart": dict(family="mbart", d=1024, layers=12, heads=16, ffn=4096, vocab=250054, spm=8000),
}
TINY = {
    "marian": dict(family="marian", d=64, layers=2, heads=4, ffn=256, vocab=3000, spm=1000),
    "nllb": dict(family="m2m100", d=64, layers=2, heads=4, ffn=256, vocab=3000, spm=1000),
    "mbart": dict(family="mbart", d=64, layers=2, heads=4, ffn=256, vocab=3000, spm=1000),
}
MBART_LANGS = 52  # MBart50Tokenizer's language codes, after the pieces and before <mask>
# The multilingual families' languages: (tokenizer's src_lang, target token, translate_batch's target_lang)
LANGS = {"m2m_100": ("en", "__fr__", "fr"), "mbart": ("en_XX", "fr_XX", "fr_XX")}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:8.1f}s] {msg}", file=sys.stderr, flush=True)


def memory_mb() -> dict:
    """VmRSS and VmHWM (peak) of this process, MB; ru_maxrss too (KB on Linux)."""
    import resource

    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return {"rss_mb": out.get("VmRSS"), "peak_rss_mb": out.get("VmHWM"),
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- text
_WORDS = ("the a this my your his her our one two three old new big small good little long great red blue green man "
          "woman child dog cat house car book tree city river friend teacher student father mother day night time "
          "year water school work room door table street music letter apple garden train is was will can must "
          "should sees likes finds reads writes takes gives makes knows wants needs buys opens closes carries "
          "quickly slowly often never always today yesterday tomorrow here there in on at with under near behind "
          "before after because and but or if when where why how very really not also still already").split()


def english_corpus() -> tuple[list[str], str]:
    """Unique English sentences to train SentencePiece on and pick test sentences from, and where they come from."""
    if TATOEBA.is_file():
        seen: dict[str, None] = {}
        with open(TATOEBA, encoding="utf-8-sig") as f:
            for line in f:
                col = line.split("\t")[0].strip()
                if col:
                    seen.setdefault(col, None)
        return list(seen), f"{TATOEBA} (first column; CC-BY 2.0 France, tatoeba.org)"
    rng = random.Random(0)
    seen = {}
    while len(seen) < 20000:
        s = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 22)))
        seen.setdefault(s[0].upper() + s[1:] + ".", None)
    return list(seen), "generated (no Tatoeba file at ../shared/data/tatoeba-cmn-eng/cmn.txt)"


def test_sentences(n: int) -> list[str]:
    """n English sentences of 8-25 words, spread evenly over the corpus (deterministic)."""
    corpus, _ = english_corpus()
    pool = [s for s in corpus if 8 <= len(s.split()) <= 25]
    if len(pool) < n:
        raise SystemExit(f"error: only {len(pool)} sentences of 8-25 words in the corpus; ask for --sentences {len(pool)} or fewer")
    step = len(pool) / n
    return [pool[int(i * step)] for i in range(n)]


# --------------------------------------------------------------------------------------------- build
def train_spm(texts: list[str], path: Path, pieces: int, total: int) -> list[str]:
    """A unigram model trained on texts (up to `pieces` pieces), then unused filler pieces appended (score far below
    every trained piece, text that never occurs) up to `total` pieces; writes it to path, returns its pieces."""
    import io

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=buf, vocab_size=pieces,
                                   model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                   num_threads=2, minloglevel=2)
    proto = pb.ModelProto()
    proto.ParseFromString(buf.getvalue())
    low = min(p.score for p in proto.pieces) - 10.0
    for i in range(total - len(proto.pieces)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"\u2581qqfill{i:06d}", low, pb.ModelProto.SentencePiece.NORMAL
    path.write_bytes(proto.SerializeToString())
    return [p.piece for p in proto.pieces]


def job_build(spec: dict) -> dict:
    import torch
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    s, out = spec["size"], Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    texts, origin = english_corpus()
    V, d, L, H, F = s["vocab"], s["d"], s["layers"], s["heads"], s["ffn"]
    shape = dict(d_model=d, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H, decoder_attention_heads=H,
                 encoder_ffn_dim=F, decoder_ffn_dim=F, scale_embedding=True)
    torch.manual_seed(spec.get("seed", 0))
    if s["family"] == "marian":
        from transformers import MarianConfig, MarianMTModel, MarianTokenizer

        # vocab.json: </s> 0, <unk> 1, the ordinary pieces, <pad> last; SentencePiece adds <unk> <s> </s> of its own
        pieces = train_spm(texts, out / "source.spm", s["spm"], V - 2 - 1 + 3)
        (out / "target.spm").write_bytes((out / "source.spm").read_bytes())
        ordinary = sorted(p for p in pieces[3:])
        vocab = {t: i for i, t in enumerate(["</s>", "<unk>"] + ordinary + ["<pad>"])}
        assert len(vocab) == V, (len(vocab), V)
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tok = MarianTokenizer(source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
                              vocab=str(out / "vocab.json"), source_lang="en", target_lang="fr", model_max_length=512)
        pad = V - 1
        config = MarianConfig(**shape, vocab_size=V, decoder_vocab_size=V, share_encoder_decoder_embeddings=True,
                              tie_word_embeddings=True, activation_function="swish", max_position_embeddings=512,
                              pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
                              bos_token_id=0, normalize_before=False, normalize_embedding=False,
                              static_position_embeddings=True, add_final_layer_norm=False)
        model = MarianMTModel(config)
        model.generation_config = GenerationConfig(
            bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
            max_length=512, num_beams=4, pad_token_id=pad, renormalize_logits=True)
    elif s["family"] == "mbart":
        from transformers import MBart50Tokenizer, MBartConfig, MBartForConditionalGeneration

        # MBart50Tokenizer's ids: <s> <pad> </s> <unk>, the pieces but SentencePiece's own three, 52 codes,
        # <mask>
        train_spm(texts, out / "sentencepiece.bpe.model", s["spm"], V - 4 - MBART_LANGS - 1 + 3)
        # bos_token as the published special_tokens_map.json has it (CTranslate2's converter reads it)
        tok = MBart50Tokenizer.from_pretrained(str(out), src_lang="en_XX", bos_token="<s>")
        assert len(tok) == V, (len(tok), V)
        config = MBartConfig(**shape, vocab_size=V, activation_function="gelu", max_position_embeddings=1024,
                             bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                             forced_eos_token_id=2, tie_word_embeddings=True, normalize_before=True,
                             normalize_embedding=True, static_position_embeddings=False,
                             add_final_layer_norm=True, add_bias_logits=False,
                             tokenizer_class="MBart50Tokenizer")  # as published; CTranslate2 reads it
        model = MBartForConditionalGeneration(config)
        model.generation_config = GenerationConfig(
            bos_token_id=0, decoder_start_token_id=2, early_stopping=True, eos_token_id=2, forced_eos_token_id=2,
            max_length=200, num_beams=5, pad_token_id=1)
    else:
        from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

        languages = FAIRSEQ_LANGUAGE_CODES["m2m100"]
        assert len(languages) == M2M_LANGS
        n_vocab = V - M2M_LANGS - M2M_MADEUP  # vocab.json: <s> <pad> </s> <unk>, then the pieces
        pieces = train_spm(texts, out / "sentencepiece.bpe.model", s["spm"], n_vocab - 4 + 3)
        vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + sorted(pieces[3:]))}
        assert len(vocab) == n_vocab, (len(vocab), n_vocab)
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tok = M2M100Tokenizer(vocab_file=str(out / "vocab.json"), spm_file=str(out / "sentencepiece.bpe.model"),
                              src_lang="en", tgt_lang="fr", num_madeup_words=M2M_MADEUP, model_max_length=1024,
                              additional_special_tokens=[f"__{c}__" for c in languages])
        config = M2M100Config(**shape, vocab_size=V, activation_function="relu", max_position_embeddings=1024,
                              bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                              tie_word_embeddings=True)
        model = M2M100ForConditionalGeneration(config)
        tok.tgt_lang = None
        model.generation_config = GenerationConfig(bos_token_id=0, decoder_start_token_id=2, early_stopping=True,
                                                   eos_token_id=2, max_length=200, num_beams=5, pad_token_id=1)
    params = sum(p.numel() for p in model.parameters())
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"parameters": params, "spm_trained_on": origin}


# -------------------------------------------------------------------------------------------- prepare
def job_prepare(spec: dict) -> dict:
    """Source ids and pieces of the test sentences as the directory's tokenizer makes them, and its id -> token table."""
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
    if m2m:  # CTranslate2 names the made-up rows madeupword0.. (its M2M100 loader); the tokenizer calls them <unk>
        for k in range(M2M_MADEUP):
            table[V - M2M_MADEUP + k] = f"madeupword{k}"
    Path(spec["vocab_out"]).write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    return {"sentences": sentences, "source_ids": ids, "source_tokens": [tok.convert_ids_to_tokens(x) for x in ids],
            "eos": config["eos_token_id"], "pad": config["pad_token_id"], "start": config["decoder_start_token_id"],
            "forced_id": tok.convert_tokens_to_ids(forced_token) if forced_token else None,
            "forced_token": forced_token, "target_lang": target_lang,
            "source_lens": [len(x) for x in ids]}


# --------------------------------------------------------------------------------------------- export
class PeakWhere:
    """Samples this process's resident set every 0.1 s with the main thread's innermost frames of the package (or
    torch, onnx, onnxruntime), and writes the largest sample so far to a file, so that a job that fails still says
    where its memory peaked."""

    def __init__(self, path: str):
        import threading

        self.path, self.best, self.main = path, 0.0, threading.main_thread().ident
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _where(self) -> list[str]:
        import traceback

        frame = sys._current_frames().get(self.main)
        if frame is None:
            return []
        stack = traceback.extract_stack(frame)
        keep = [f for f in stack if any(k in f.filename for k in ("/seq2onnx/", "/work/main/", "/torch/onnx/", "/onnx/",
                                                                   "/onnxruntime/"))]
        return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in keep[-4:]]

    def _run(self):
        while not self.stop.wait(0.1):
            rss = memory_mb()["rss_mb"]
            if rss > self.best + 16:
                self.best = rss
                write_atomic(Path(self.path), json.dumps({"rss_mb": rss, "where": self._where(),
                                                          "at_s": time.perf_counter() - T0}))

    def close(self) -> dict:
        self.stop.set()
        self.thread.join()
        return json.loads(Path(self.path).read_text()) if Path(self.path).is_file() else {}


def job_export(spec: dict) -> dict:
    import torch  # noqa: F401  (imports before the clock and the baseline)

    from seq2onnx.export.hf.bundle import export_hf_bundle

    base = memory_mb()["rss_mb"]
    sampler = PeakWhere(spec["result"] + ".peak")
    t = time.perf_counter()
    export_hf_bundle(spec["model_dir"], spec["out"], quantize=spec["quantize"], force=True)
    seconds = time.perf_counter() - t
    files = {p.name: p.stat().st_size for p in Path(spec["out"]).iterdir() if p.suffix in (".onnx", ".bin")}
    return {"seconds": seconds, "rss_after_imports_mb": base, "bytes": dir_bytes(Path(spec["out"])),
            "graph_and_weights_bytes": files, "peak_where": sampler.close()}


def job_ct2_convert(spec: dict) -> dict:
    import ctranslate2  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from ctranslate2.converters import TransformersConverter

    base = memory_mb()["rss_mb"]
    t = time.perf_counter()
    TransformersConverter(spec["model_dir"]).convert(spec["out"], quantization=None, force=True)
    seconds = time.perf_counter() - t
    # the anchor of an int8 bundle's size: CTranslate2's own converter with quantization="int8" (size only)
    TransformersConverter(spec["model_dir"]).convert(spec["out"] + "-int8", quantization="int8", force=True)
    return {"seconds": seconds, "rss_after_imports_mb": base, "bytes": dir_bytes(Path(spec["out"])),
            "int8_model_bin_bytes": (Path(spec["out"] + "-int8") / "model.bin").stat().st_size,
            "model_bin_bytes": (Path(spec["out"]) / "model.bin").stat().st_size}


# --------------------------------------------------------------------------------------------- engines
def _strip(row: list[int], eos: int, pad: int) -> list[int]:
    """A generate() row as our token_ids: without the start token, without the end token and what follows it."""
    ids = row[1:]
    if eos in ids:
        return ids[: ids.index(eos)]
    while ids and ids[-1] == pad:
        ids.pop()
    return ids


def _decoder(spec: dict, prep: dict):
    """(RSS after imports MB, load seconds, decode(indices, beam) -> list of outputs: id lists, or token lists for CTranslate2)."""
    engine, L, threads = spec["engine"], spec["max_new_tokens"], spec["threads"]
    if engine == "torch":
        import torch
        from transformers import AutoModelForSeq2SeqLM
        from transformers.utils import logging as hf_logging
    elif engine == "ours":
        from seq2onnx.runtime.translator import Translator
    else:
        import ctranslate2
    base = memory_mb()["rss_mb"]
    t = time.perf_counter()
    if engine == "torch":
        hf_logging.set_verbosity_error()
        torch.set_num_threads(threads)
        model = AutoModelForSeq2SeqLM.from_pretrained(spec["model_dir"], dtype=torch.float32).eval()
        eos, pad = prep["eos"], prep["pad"]
        extra = {"forced_bos_token_id": prep["forced_id"]} if prep["forced_id"] is not None else {}
        # transformers forces </s> as the last token at max_length where generation_config says forced_eos_token_id
        # (OPUS-MT: 0); imported bundles do too (decoding.forced_eos), CTranslate2 does not (see the report's notes).

        def decode(idx, beam):
            srcs = [prep["source_ids"][i] for i in idx]
            n = max(map(len, srcs))
            ids = torch.tensor([s + [pad] * (n - len(s)) for s in srcs])
            mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in srcs])
            opts = dict(early_stopping=True, length_penalty=1.0) if beam > 1 else {}
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                     max_length=L + 1, min_length=0, **opts, **extra)
            return [_strip(r, eos, pad) for r in out.tolist()]
    elif engine == "ours":
        tr = Translator(spec["bundle"], device="cpu", intra_threads=threads)
        extra = {"target_lang": prep.get("target_lang", "fr")} if prep["forced_id"] is not None else {}

        def decode(idx, beam):
            res = tr.translate_batch([prep["source_ids"][i] for i in idx], beam_size=beam, max_decoding_length=L,
                                     min_decoding_length=0, length_penalty=1.0, max_batch_size=32, **extra)
            return [list(r.token_ids[0]) for r in res]
    else:
        tr = ctranslate2.Translator(spec["ct2_dir"], device="cpu", compute_type=spec["compute_type"],
                                    intra_threads=threads, inter_threads=1)
        forced = prep["forced_token"]
        # CTranslate2's max_decoding_length counts the target prefix (the forced __fr__), as ours and transformers'
        # max_length - 1 do (checked on --tiny: all three give 32 tokens, __fr__ included).
        limit = L

        def decode(idx, beam):
            extra = {"target_prefix": [[forced]] * len(idx)} if forced else {}
            res = tr.translate_batch([prep["source_tokens"][i] for i in idx], beam_size=beam, max_decoding_length=limit,
                                     min_decoding_length=0, length_penalty=1.0, max_batch_size=32,
                                     return_scores=False, **extra)
            return [r.hypotheses[0] for r in res]
    return base, time.perf_counter() - t, decode


def job_engine(spec: dict) -> dict:
    prep = json.loads(Path(spec["prepared"]).read_text(encoding="utf-8"))
    base, load_s, decode = _decoder(spec, prep)
    loaded = memory_mb()["rss_mb"]
    n, L = len(prep["source_ids"]), spec["max_new_tokens"]
    rows = {}
    for search, beam, batch in ROWS:
        name = f"{search} b{batch}"
        order = list(range(min(spec["batch1_sentences"], n))) if batch == 1 else list(range(n))
        batches = [order[i: i + batch] for i in range(0, len(order), batch)]
        decode(batches[0], beam)  # warm-up
        t = time.perf_counter()
        outputs = []
        for b in batches:
            outputs += decode(b, beam)
        seconds = time.perf_counter() - t
        tokens = sum(min(len(o) + 1, L) for o in outputs)  # + the end token, unless the limit cut the output
        rows[name] = {"seconds": seconds, "tokens": tokens, "sentences": len(order), "outputs": outputs}
        print(f"  {spec['label']}: {name}: {tokens / seconds:.1f} tokens/s ({seconds:.2f} s)", file=sys.stderr, flush=True)
    return {"load_s": load_s, "rss_after_imports_mb": base, "rss_after_load_mb": loaded, "rows": rows}


JOBS = {"build": job_build, "prepare": job_prepare, "export": job_export, "ct2_convert": job_ct2_convert,
        "engine": job_engine}


def child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    result = JOBS[spec["job"]](spec)
    result.update(memory_mb())
    write_atomic(Path(spec["result"]), json.dumps(result))


# ----------------------------------------------------------------------------------------------- parent
def child_rss_gb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def run_job(spec: dict, work: Path, name: str, timeout: float, max_rss_gb: float = float("inf")) -> dict:
    """Runs one job in a child process; returns its result, or {"error": ...} with the end of its stderr."""
    jobs = work / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, result=str(jobs / f"{name}.result.json"), label=name)
    spec_path = jobs / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    Path(spec["result"]).unlink(missing_ok=True)
    Path(spec["result"] + ".peak").unlink(missing_ok=True)
    log_path = jobs / f"{name}.log"
    t = time.perf_counter()
    killed, seen = None, 0.0
    with open(log_path, "w") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--job", str(spec_path)], stdout=err, stderr=subprocess.STDOUT,
                                env={**os.environ, **spec.get("env", {})})
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                seen = max(seen, child_rss_gb(proc.pid))
                if time.perf_counter() - t > timeout:
                    killed = f"killed by this script: timed out after {timeout:.0f} s"
                elif seen > max_rss_gb:
                    killed = (f"killed by this script: resident set {seen:.1f} GB, over --max-job-rss-gb {max_rss_gb:.1f} "
                              "(protecting the machine from the OOM killer)")
                if killed:
                    proc.kill()
                    proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - t
    text = log_path.read_text(errors="replace")
    for line in text.splitlines():
        if line.endswith(" s)") and "tokens/s" in line:
            log(line.strip())
    if proc.returncode != 0 or not Path(spec["result"]).is_file():
        why = killed or f"exit {proc.returncode}"
        lines = [x.strip() for x in text.strip().splitlines() if x.strip() and "tokens/s (" not in x]
        raised = [x for x in lines if x.split(":")[0].endswith(("Error", "Exception", "Interrupt"))]
        error = f"{why}: " + (raised[-1] if raised else " | ".join(lines[-3:])) if lines else why
        log(f"{name}: FAILED after {wall:.0f} s ({error[:600]}); log: {log_path}")
        peak_file = Path(spec["result"] + ".peak")
        where = json.loads(peak_file.read_text()) if peak_file.is_file() else None
        return {"error": error, "log": str(log_path), "wall_s": wall, "peak_rss_seen_gb": seen, "peak_where": where}
    result = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    result["wall_s"] = wall
    return result


def code_state() -> dict:
    """The checkout measured: HEAD and the files of the package changed from it (the importer and runtime under test)."""
    root = Path(__file__).resolve().parents[1]

    def git(*a):
        try:
            return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=30).stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = [line[3:] for line in git("status", "--porcelain", "--", "export", "runtime", "model").splitlines()]
    return {"head": git("log", "-1", "--format=%h %ci %s")[:200].strip(), "changed": changed}


def macs(size: dict) -> dict:
    """Multiply-adds of one decoder step at one row, from the config (not measured)."""
    d, L, F, V = size["d"], size["layers"], size["ffn"], size["vocab"]
    layers = L * (4 * d * d + 2 * d * d + 2 * d * F)  # self-attention q,k,v,o; cross q,o; feed-forward
    return {"layers": layers, "projection": d * V, "share": d * V / (layers + d * V)}


def run_model(name: str, size: dict, args, work: Path) -> dict:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    entry: dict = {"model": name, "size": size, "started": started, "load_start": os.getloadavg(),
                   "sentences": args.sentences, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                   "repeat": args.repeat, "batch1_sentences": args.batch1_sentences,
                   "ct2_threads": args.ct2_threads, "ct2_mkl": args.ct2_mkl, "max_job_rss_gb": args.max_job_rss_gb, "errors": {}}
    entry["code"] = code_state()
    t_model = time.perf_counter()
    tag = f"{'tiny-' if args.tiny else ''}{name}"
    mdir = work / "models" / tag
    if not (mdir / "model.safetensors").is_file():
        if args.skip_build:
            raise SystemExit(f"error: --skip-build but {mdir} holds no built model; run once without --skip-build")
        log(f"{tag}: building the model directory {mdir} (random weights, seed 0)")
        partial = work / "models" / f".{tag}.partial"
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
        built = run_job({"job": "build", "size": size, "out": str(partial)}, work, f"{tag}-build", args.job_timeout, args.max_job_rss_gb)
        if "error" in built:
            entry["errors"]["build"] = built["error"]
            return entry
        (partial / "build.json").write_text(json.dumps(built))
        partial.rename(mdir)
        log(f"{tag}: built in {built['wall_s']:.0f} s, peak RSS {built['peak_rss_mb']:.0f} MB")
    entry["build"] = json.loads((mdir / "build.json").read_text())
    entry["model_dir"] = str(mdir)
    entry["weights_bytes"] = (mdir / "model.safetensors").stat().st_size
    out = work / "out" / tag
    out.mkdir(parents=True, exist_ok=True)
    prep = run_job({"job": "prepare", "model_dir": str(mdir), "sentences": test_sentences(args.sentences),
                    "vocab_out": str(out / "id_to_token.json")}, work, f"{tag}-prepare", args.job_timeout, args.max_job_rss_gb)
    if "error" in prep:
        entry["errors"]["prepare"] = prep["error"]
        return entry
    prepared = out / "prepared.json"
    prepared.write_text(json.dumps(prep, ensure_ascii=False), encoding="utf-8")
    entry["source_lengths"] = {"mean": statistics.mean(prep["source_lens"]), "max": max(prep["source_lens"])}

    steps_file = out / "steps.json"
    if args.skip_exports:
        if not steps_file.is_file():
            raise SystemExit(f"error: --skip-exports but {steps_file} is missing; run once without --skip-exports")
        steps = json.loads(steps_file.read_text())
        entry["steps_reused_from"] = f"{steps_file} ({time.ctime(steps_file.stat().st_mtime)})"
        log(f"{tag}: export and conversion results reused from {entry['steps_reused_from']}")
    else:
        steps = {}
        for key, quantize in (("export_fp32", None), ("export_int8", "int8")):
            log(f"{tag}: {key}")
            steps[key] = run_job({"job": "export", "model_dir": str(mdir), "out": str(out / key.replace("export_", "bundle-")),
                                  "quantize": quantize}, work, f"{tag}-{key}", args.job_timeout, args.max_job_rss_gb)
        log(f"{tag}: CTranslate2 conversion (fp32)")
        steps["ct2_convert"] = run_job({"job": "ct2_convert", "model_dir": str(mdir), "out": str(out / "ct2")}, work,
                                       f"{tag}-ct2_convert", args.job_timeout, args.max_job_rss_gb)
        steps_file.write_text(json.dumps(steps))
    for key, r in steps.items():
        if "error" in r:
            entry["errors"][key] = r["error"]
        else:
            log(f"{tag}: {key}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, {r['bytes'] / 1e6:.0f} MB")
    entry["steps"] = steps

    common = {"job": "engine", "prepared": str(prepared), "max_new_tokens": args.max_new_tokens, "model_dir": str(mdir),
              "batch1_sentences": args.batch1_sentences}
    engines = {"torch": dict(engine="torch", threads=args.threads)}
    for variant in ("fp32", "int8"):
        if "error" not in steps[f"export_{variant}"]:
            engines[f"ours-{variant}"] = dict(engine="ours", threads=args.threads, bundle=str(out / f"bundle-{variant}"))
        if "error" not in steps["ct2_convert"]:
            for th in args.ct2_threads:
                engines[f"ct2-{variant}-t{th}"] = dict(engine="ct2", threads=th, ct2_dir=str(out / "ct2"),
                                                       compute_type="float32" if variant == "fp32" else "int8")
            if args.ct2_mkl and variant == "fp32" and "error" not in steps["ct2_convert"]:
                engines[f"ct2-{variant}-t{args.threads}-mkl"] = dict(
                    engine="ct2", threads=args.threads, ct2_dir=str(out / "ct2"), env={"CT2_USE_MKL": "1"},
                    compute_type="float32" if variant == "fp32" else "int8")
    rounds = []
    names = list(engines)
    for r in range(args.repeat):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate: no engine always first
        results = {}
        for e in order:
            log(f"{tag}: round {r + 1}/{args.repeat}: {e}")
            results[e] = run_job({**common, **engines[e]}, work, f"{tag}-{e}-r{r}", args.job_timeout, args.max_job_rss_gb)
            if "error" in results[e]:
                entry["errors"][f"{e} (round {r + 1})"] = results[e]["error"]
        rounds.append(results)
    entry["rounds"] = rounds
    entry.update(summarise(rounds, names, out / "id_to_token.json", args.max_new_tokens))
    entry["load_end"] = os.getloadavg()
    entry["wall_s"] = time.perf_counter() - t_model
    entry["macs"] = macs(size)
    return entry


def summarise(rounds: list[dict], names: list[str], table_path: Path, L: int) -> dict:
    """tokens/s per engine and row (median over rounds), identity with transformers, ratios within rounds."""
    table = json.loads(table_path.read_text(encoding="utf-8"))
    to_id = {}
    for i, t in enumerate(table):
        to_id.setdefault(t, i)
    first = rounds[0]
    ref = first.get("torch", {}).get("rows")
    rows, identity = {}, {}
    for e in names:
        res = first.get(e, {})
        if "rows" not in res:
            continue
        for row, r in res["rows"].items():
            outs = r["outputs"]
            if e.startswith("ct2"):
                outs = [[to_id.get(t, -1) for t in o] for o in outs]
            if ref is not None:
                same = sum(a == b for a, b in zip(outs, ref[row]["outputs"]))
                identity.setdefault(e, {})[row] = f"{same}/{len(outs)}"
    best_of = {}
    for e in names:
        for row in (f"{s} b{b}" for s, _, b in ROWS):
            vals = [rd[e]["rows"][row]["tokens"] / rd[e]["rows"][row]["seconds"] for rd in rounds if "rows" in rd.get(e, {})]
            if vals:
                rows.setdefault(e, {})[row] = statistics.median(vals)
                best_of.setdefault(e, {})[row] = max(vals)

    def ratio(a: str, b_names: list[str], row: str):
        per = []
        for rd in rounds:
            if "rows" not in rd.get(a, {}):
                continue
            bs = [rd[b]["rows"][row]["tokens"] / rd[b]["rows"][row]["seconds"] for b in b_names if "rows" in rd.get(b, {})]
            if bs:
                per.append(rd[a]["rows"][row]["tokens"] / rd[a]["rows"][row]["seconds"] / max(bs))
        return statistics.median(per) if per else None

    ratios = {}
    for row in (f"{s} b{b}" for s, _, b in ROWS):
        for variant in ("fp32", "int8"):
            ct2 = [n for n in names if n.startswith(f"ct2-{variant}-")]
            best = max((n for n in ct2 if row in rows.get(n, {})), key=lambda n: rows[n][row], default=None)
            ratios.setdefault(row, {})[f"ct2_{variant}_best"] = best
            ratios[row][f"ours_{variant}_vs_ct2"] = ratio(f"ours-{variant}", ct2, row)
            ratios[row][f"ours_{variant}_vs_torch"] = ratio(f"ours-{variant}", ["torch"], row)
            ratios[row][f"ct2_{variant}_vs_torch"] = ratio(best, ["torch"], row) if best else None
    # Best of rounds: on a machine shared with other work, interference only slows a pass, so the fastest pass of each
    # engine is the better estimate of its speed; ratios of bests alongside.
    best_ratios = {}
    for row in (f"{s} b{b}" for s, _, b in ROWS):
        for variant in ("fp32", "int8"):
            ct2 = [n for n in names if n.startswith(f"ct2-{variant}-") and row in best_of.get(n, {})]
            top = max(ct2, key=lambda n: best_of[n][row], default=None)
            ours = best_of.get(f"ours-{variant}", {}).get(row)
            torch_ = best_of.get("torch", {}).get(row)
            best_ratios.setdefault(row, {})[f"ct2_{variant}_best"] = top
            best_ratios[row][f"ours_{variant}_vs_ct2"] = ours / best_of[top][row] if ours and top else None
            best_ratios[row][f"ours_{variant}_vs_torch"] = ours / torch_ if ours and torch_ else None
            best_ratios[row][f"ct2_{variant}_vs_torch"] = best_of[top][row] / torch_ if top and torch_ else None
    return {"tokens_per_s": rows, "identity": identity, "ratios": ratios, "tokens_per_s_best": best_of,
            "ratios_best": best_ratios}


# ----------------------------------------------------------------------------------------------- report
def fmt(x, spec=".1f", none="—"):
    suffix = "×" if spec.endswith("×") else ""
    return none if x is None else format(x, spec.rstrip("×")) + suffix


def markdown(report: dict) -> str:
    lines = ["# Real sizes: Hugging Face Marian and M2M100 imports against CTranslate2 and PyTorch", "",
             f"Machine: {report['machine']}", ""]
    for name, m in report["models"].items():
        s = m["size"]
        lines += [f"## {name}: d_model {s['d']}, {s['layers']}+{s['layers']} layers, {s['heads']} heads, ffn {s['ffn']}, "
                  f"vocabulary {s['vocab']:,}", ""]
        b = m.get("build", {})
        b1 = min(m.get("batch1_sentences", BATCH1_SENTENCES), m["sentences"])
        lines.append(f"Started {m['started']}; {m['sentences']} sentences (batch-1 rows: the first {b1}, one at a time; "
                     f"b32 rows: batches of up to 32, here {min(32, m['sentences'])} sentences a batch), "
                     f"max {m['max_new_tokens']} new tokens, min 0, length penalty 1.0, {m['threads']} threads, "
                     f"{m['repeat']} round(s), CTranslate2 intra_threads {m.get('ct2_threads', [m['threads'], 1])}; load average at start {fmt_load(m['load_start'])}, at end "
                     f"{fmt_load(m.get('load_end'))}; wall {fmt(m.get('wall_s'), '.0f')} s.")
        if m.get("code"):
            lines.append(f"Code measured: {m['code']['head']}" + (f"; uncommitted changes in {', '.join(m['code']['changed'])}"
                                                                 if m["code"]["changed"] else "") + ".")
        if b:
            lines.append(f"Parameters {b['parameters']:,}; SentencePiece trained on {b['spm_trained_on']}.")
        if "source_lengths" in m:
            lines.append(f"Source length (tokens, with the end token{', the language token' if s['family'] == 'm2m100' else ''}): "
                         f"mean {m['source_lengths']['mean']:.1f}, max {m['source_lengths']['max']}.")
        lines.append("")
        w = m.get("weights_bytes")
        if w:
            lines += ["| step | seconds | peak RSS MB | RSS after imports MB | peak / fp32 weights (goal ≤ 3×) | output MB |",
                      "|---|---|---|---|---|---|"]
            lines.append(f"| fp32 weights (model.safetensors) | | | | | {w / 1e6:.0f} |")
            wheres = []
            for key, r in m.get("steps", {}).items():
                pw = r.get("peak_where") or {}
                if pw.get("where"):
                    wheres.append(f"- {key}: largest resident set sampled {pw['rss_mb']:.0f} MB in "
                                  f"{' > '.join(pw['where'])}")
                if "error" in r:
                    lines.append(f"| {key} | FAILED after {r['wall_s']:.0f} s (peak RSS seen {r.get('peak_rss_seen_gb', 0) * 1024:.0f} MB): "
                                 f"{r['error'][-400:]} | | | | |")
                else:
                    peak = r["peak_rss_mb"] * 2**20
                    net = (r["peak_rss_mb"] - r["rss_after_imports_mb"]) * 2**20
                    lines.append(f"| {key} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} | {r['rss_after_imports_mb']:.0f} | "
                                 f"{peak / w:.2f}× ({net / w:.2f}× above the imports) | {r['bytes'] / 1e6:.0f} |")
            lines.append("")
            if m.get("steps_reused_from"):
                lines += [f"Export and conversion measurements reused from {m['steps_reused_from']}.", ""]
            if wheres:
                lines += ["Where the exports' memory peaked (sampled every 0.1 s by a Python thread, innermost frames last; "
                          "it cannot sample while a C++ call holds the GIL, e.g. torch.onnx's serialisation, so the parent's "
                          "peak RSS seen can be higher):", ""] + wheres + [""]
        use_best = m.get("repeat", 1) > 1 and "tokens_per_s_best" in m
        tps = m.get("tokens_per_s_best" if use_best else "tokens_per_s", {})
        ratios = m.get("ratios_best" if use_best else "ratios", {})
        if tps:
            lines += ["| row | PyTorch generate | ours fp32 | CT2 fp32 best | ours fp32 / CT2 fp32 | ours fp32 / PyTorch "
                      "| ours int8 | CT2 int8 best | ours int8 / CT2 int8 | ours int8 / PyTorch |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for row in (f"{sr} b{bt}" for sr, _, bt in ROWS):
                ra = ratios[row]
                cells = [row, fmt(tps.get("torch", {}).get(row))]
                for v in ("fp32", "int8"):
                    best = ra[f"ct2_{v}_best"]
                    cells += [fmt(tps.get(f"ours-{v}", {}).get(row)),
                              f"{fmt(tps.get(best, {}).get(row))} ({best.split('-', 2)[2] if best else '—'})",
                              fmt(ra[f"ours_{v}_vs_ct2"], ".2f×"), fmt(ra[f"ours_{v}_vs_torch"], ".2f×")]
                lines.append("| " + " | ".join(cells) + " |")
            lines += ["", "tokens/s (generated target tokens incl. the end token"
                      f"{' and the forced __fr__' if s['family'] == 'm2m100' else ''}, per second of wall time); "
                      "CT2 best: the fastest of the intra_threads settings "
                      f"{m.get('ct2_threads', [m['threads'], 1])}{' and t2-mkl' if m.get('ct2_mkl') else ''} for that row "
                      "(tN: N threads); "
                      + (f"each figure is the engine's FASTEST of {m['repeat']} rounds (the machine was shared: interference "
                         "only slows a pass) and ratios are ratios of those; report.json also has the medians and the "
                         "within-round ratios" if use_best else "one round")
                      + "; CT2 int8 / PyTorch: "
                      + ", ".join(f"{row} {fmt(ratios[row]['ct2_int8_vs_torch'], '.2f×')}" for row in ratios)
                      + "; CT2 fp32 / PyTorch: "
                      + ", ".join(f"{row} {fmt(ratios[row]['ct2_fp32_vs_torch'], '.2f×')}" for row in ratios)
                      + (". -mkl: CT2_USE_MKL=1" if m.get("ct2_mkl") else "") + ".", ""]
            lines += ["| engine | load s | RSS after imports MB | RSS after load MB | peak RSS MB | identical to transformers "
                      "(greedy b1 / greedy b32 / beam4 b1 / beam4 b32) |", "|---|---|---|---|---|---|"]
            for e, r in m["rounds"][0].items():
                if "error" in r:
                    lines.append(f"| {e} | FAILED: {r['error'][:300]} | | | | |")
                    continue
                ident = m["identity"].get(e, {})
                lines.append(f"| {e} | {r['load_s']:.1f} | {r['rss_after_imports_mb']:.0f} | {r['rss_after_load_mb']:.0f} | "
                             f"{r['peak_rss_mb']:.0f} | {' / '.join(ident.get(f'{sr} b{bt}', '—') for sr, _, bt in ROWS)} |")
            lines.append("")
        mc = m.get("macs")
        if mc:
            lines.append(f"Computed, not measured: one decoder step at one row is {mc['layers'] / 1e6:.1f}M multiply-adds in "
                         f"the {s['layers']} layers (self-attention 4d², cross-attention query and output 2d², feed-forward "
                         f"2·d·ffn each) and {mc['projection'] / 1e6:.1f}M in the output projection (d·V): the projection is "
                         f"{100 * mc['share']:.0f}% of a step's multiply-adds (attention over the cache aside). At one row "
                         "a step streams every weight matrix once, so its time follows those bytes: the projection's "
                         f"{4 * mc['projection'] / 1e6:.0f} MB fp32 against the layers' {4 * mc['layers'] / 1e6:.0f} MB.")
            lines.append("")
        if m.get("errors"):
            lines += ["Failures:", ""] + [f"- {k}: {v}" for k, v in m["errors"].items()] + [""]
    lines += ["Notes:", "",
              "- transformers' generate runs with the model's forced_eos_token_id (OPUS-MT's generation_config has 0: "
              "</s> forced as the last token at max_length); imported bundles do the same (decoding.forced_eos), "
              "CTranslate2 does not, and random weights run every sentence to max_length, so CTranslate2's Marian "
              "outputs differ from transformers' in that last token.",
              "- Every engine gets the same limit: our max_decoding_length, CTranslate2's max_decoding_length and "
              "transformers' max_length - 1 all count the forced __fr__ and the end token (checked: equal output lengths).",
              "- Random weights: near-ties in the scores are possible; identity below n/n at fp32 is reported, not judged. "
              "int8 engines legitimately differ.", ""]
    full = []
    for name, m in report["models"].items():
        ref = (m.get("rounds") or [{}])[0].get("torch", {}).get("rows", {})
        outs = [o for r in ref.values() for o in r["outputs"]]
        if outs:
            full.append(f"{name} {sum(len(o) == m['max_new_tokens'] for o in outs)}/{len(outs)}")
    if full:
        lines.pop()
        lines += ["- Outputs of transformers that ran to the length limit (no end token generated), over all rows: "
                  + ", ".join(full) + ": the tokens counted are then the limit per sentence, for every engine alike.", ""]
    return "\n".join(lines)


def fmt_load(load) -> str:
    return "—" if not load else " ".join(f"{x:.2f}" for x in load)


def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 16.0


def machine() -> str:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Issue 25 item 6: OPUS-MT-size Marian and NLLB-600M-size M2M100 (random weights) exported with "
                    "seq2onnx, against CTranslate2 and PyTorch's generate: export time and memory, bundle sizes, tokens/s "
                    "and token identity. Run once, by hand; not part of CI.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--work", type=Path, help="working directory: model directories (cached: a rerun reuses them), "
                                             "bundles, CTranslate2 models, job logs (WORK/jobs/*.log)")
    p.add_argument("--models", default="marian,nllb",
                   help="comma-separated subset of marian,nllb,mbart (default marian,nllb)")
    p.add_argument("--sentences", type=int, default=32, help="test sentences (default 32); the batch-32 rows decode them "
                                                             "in batches of 32, the batch-1 rows the first 8 one at a time")
    p.add_argument("--max-new-tokens", type=int, default=32,
                   help="generated tokens per sentence at most, end token included (default 32; transformers' "
                        "max_length = this + 1, since it counts the decoder start token)")
    p.add_argument("--threads", type=int, default=2, help="threads per engine (default 2); CTranslate2 also runs at 1")
    p.add_argument("--repeat", type=int, default=1, help="rounds of all engines, order rotated (default 1): tokens/s "
                                                         "and ratios are medians over rounds")
    p.add_argument("--batch1-sentences", type=int, default=BATCH1_SENTENCES,
                   help=f"sentences the batch-1 rows decode one at a time (default {BATCH1_SENTENCES})")
    p.add_argument("--ct2-threads", default=None,
                   help="CTranslate2 intra_threads settings to run, comma-separated (default: THREADS and 1); the faster "
                        "per row is compared")
    p.add_argument("--ct2-mkl", action="store_true",
                   help="also run CTranslate2 fp32 with CT2_USE_MKL=1 at THREADS threads (its default on AMD CPUs is oneDNN "
                        "for fp32 GEMM; CT2_VERBOSE=1 shows the backend): another setting in the per-row best. Not for "
                        "int8: MKL's int8 path measured 10-40x slower than oneDNN's on an AMD EPYC")
    p.add_argument("--skip-exports", action="store_true",
                   help="do not export or convert again: reuse the bundles, the CTranslate2 model and their measurements "
                        "from the previous run (WORK/out/MODEL/steps.json)")
    p.add_argument("--render-only", action="store_true", help="rewrite OUT/report.md from OUT/report.json and exit")
    p.add_argument("--skip-build", action="store_true",
                   help="never build: fail unless WORK/models already holds the model directories")
    p.add_argument("--tiny", action="store_true", help="small configs (d_model 64, 2+2 layers, vocabulary 3000): "
                                                       "checks the whole pipeline in about a minute")
    p.add_argument("--out", type=Path, help="where report.json and report.md go (default WORK/results, or "
                                            "WORK/results-tiny with --tiny); an existing report there is merged")
    p.add_argument("--job-timeout", type=float, default=3600, help="seconds before a child job is killed (default 3600)")
    p.add_argument("--max-job-rss-gb", type=float, default=None,
                   help="kill a child whose resident set passes this many GB, recording why (default: 85%% of the memory "
                        "available at the start), so that an export too large for the machine fails alone rather than "
                        "waking the OOM killer")
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        child_main(args.job)
        return 0
    if args.work is None:
        p.error("--work DIR is required")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in SIZES]
    if bad or not models:
        p.error(f"--models: unknown {bad or models}; choose from {', '.join(SIZES)}")
    if args.sentences < 1 or args.max_new_tokens < 2 or args.threads < 1 or args.repeat < 1 or args.batch1_sentences < 1:
        p.error("--sentences, --batch1-sentences, --threads and --repeat must be >= 1, --max-new-tokens >= 2")
    try:
        args.ct2_threads = [int(x) for x in (args.ct2_threads or f"{args.threads},1").split(",")]
        args.ct2_threads = sorted(set(args.ct2_threads), reverse=True)
        assert args.ct2_threads and min(args.ct2_threads) >= 1
    except (ValueError, AssertionError):
        p.error(f"--ct2-threads {args.ct2_threads}: give positive integers separated by commas, e.g. 2,1")
    if args.max_job_rss_gb is None:
        args.max_job_rss_gb = 0.85 * mem_available_gb()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = (args.out or work / ("results-tiny" if args.tiny else "results")).resolve()
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {"models": {}}
    if args.render_only:
        if not report["models"]:
            raise SystemExit(f"error: --render-only: no report at {report_path}")
        for entry in report["models"].values():  # the summaries again, from the raw rounds (older reports lack some)
            if entry.get("rounds") and entry.get("model_dir"):
                mdir = Path(entry["model_dir"])
                table = mdir.parents[1] / "out" / mdir.name / "id_to_token.json"
                entry.update(summarise(entry["rounds"], list(entry["rounds"][0]), table, entry["max_new_tokens"]))
        write_atomic(report_path, json.dumps(report, indent=1))
        write_atomic(out / "report.md", markdown(report))
        print(markdown(report))
        return 0
    report["machine"] = machine()
    log(f"load average at start {fmt_load(os.getloadavg())}; {mem_available_gb():.1f} GB available, a child is killed "
        f"over {args.max_job_rss_gb:.1f} GB; work {work}; results {out}")
    for name in models:
        entry = run_model(name, (TINY if args.tiny else SIZES)[name], args, work)
        entry["command"] = " ".join([Path(sys.executable).name, *sys.argv])
        report["models"][name] = entry
        write_atomic(report_path, json.dumps(report, indent=1))
        write_atomic(out / "report.md", markdown(report))
    print(markdown(report))
    log(f"done; load average {fmt_load(os.getloadavg())}; {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
