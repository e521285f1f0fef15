"""CTranslate2 and an echo ceiling behind `seq2onnx serve`'s own front end (for scripts/serve_wrk.py).

    python scripts/serve_ct2.py BUNDLE CT2_MODEL_DIR --port 0 --inter-threads 1 --intra-threads 2
    python scripts/serve_ct2.py BUNDLE --echo --port 0        # the ceiling: the front end alone

CT2Engine implements serve/engine.py's Engine, so serve/app.py's create_app serves it exactly as it
serves our engines (same admission, limits, JSON, server): only the decoding differs. Texts are
tokenised by the bundle's Translator (Translator.prepare_source: the bundle's SentencePiece model and
the end token, as translate_batch does) and the ids given to CTranslate2 as pieces; its pieces come back
as our target ids and are detokenised by the runtime's decoder. Each request is one
`ctranslate2.Translator.translate_batch` call (one per distinct length limit: see CT2Engine.submit) on a
thread pool of `inter_threads` workers, CTranslate2's own recipe for serving: `inter_threads` requests
decode in parallel, each on `intra_threads` threads.
CT2_MODEL_DIR is the same checkpoint's CTranslate2 model: `seq2onnx export CKPT DIR --format ctranslate2`
or the bare model `seq2onnx bench --bundle-dir D` leaves in D/ct2 (export/ctranslate2/convert.py).
With --echo, EchoEngine answers each text with itself: tokenised, never decoded (what the front end,
JSON and tokenisation alone allow).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import logging
import sys
from pathlib import Path
from typing import Iterator

from seq2onnx.runtime.options import SearchOptions
from seq2onnx.runtime.text import text_increments
from seq2onnx.runtime.translator import TranslationResult, Translator
from seq2onnx.serve.engine import Engine, Job

COMPUTE_TYPES = ("float32", "int8")
# SearchOptions fields CTranslate2 cannot give as our runtime does, with the reason (a request naming one gets
# a 422).
UNSUPPORTED = {
    "sampling_temperature": "its sampler draws other random numbers than ours",
    "seed": "its sampler draws other random numbers than ours",
    "return_attention": "its attention is not our runtime's (averaged last-layer cross-attention)",
    "source_lang": "the served model is monolingual here",
    "target_lang": "the served model is monolingual here",
    "target_prefix": "not wired to CTranslate2's target_prefix in this benchmark",
}


class CT2Engine(Engine):
    """Each request decoded by ctranslate2.Translator.translate_batch, `inter_threads` requests at a time.

    Args:
        translator: the bundle's Translator: tokenisation, length limits, option defaults and detokenisation
            (its ONNX sessions are never run; give it intra_threads=1 so that they hold no thread pool).
        ct2_model_dir: the CTranslate2 model of the same checkpoint.
        inter_threads: requests decoded at once (CTranslate2 workers, and the threads submitting to them).
        intra_threads: threads per CTranslate2 worker.
        compute_type: "float32" (the bundle's precision) or "int8" (quantized on load).

    Raises:
        ValueError: a thread count below 1, an unknown compute_type, or a directory CTranslate2 cannot load.
    """

    batching = "ct2"

    def __init__(
        self,
        translator: Translator,
        ct2_model_dir: str | Path,
        *,
        inter_threads: int = 1,
        intra_threads: int = 2,
        compute_type: str = "float32",
    ):
        import ctranslate2

        super().__init__(translator)
        for name, value in (("inter_threads", inter_threads), ("intra_threads", intra_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; give an int >= 1")
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"compute_type={compute_type!r}; choose one of {', '.join(COMPUTE_TYPES)}")
        model = Path(ct2_model_dir) / "model.bin"
        if not model.is_file():
            raise ValueError(
                f"{model} does not exist: give a CTranslate2 model directory "
                "(seq2onnx export CKPT DIR --format ctranslate2)"
            )
        recipe = Path(ct2_model_dir) / "seq2onnx-ct2.json"  # an export's (the bare model of `bench` has none)
        theirs = json.loads(recipe.read_text()).get("source_checkpoint") if recipe.is_file() else None
        ours = translator.bundle.meta.get("source_checkpoint")
        if theirs and ours and theirs != ours:
            raise ValueError(
                f"{ct2_model_dir} was exported from checkpoint {theirs}, the bundle from {ours}: export "
                "both from the same checkpoint"
            )
        try:
            self.ct2 = ctranslate2.Translator(
                str(ct2_model_dir),
                device="cpu",
                compute_type=compute_type,
                inter_threads=inter_threads,
                intra_threads=intra_threads,
            )
        except (RuntimeError, ValueError) as e:
            raise ValueError(
                f"{model}: CTranslate2 cannot load it ({e}): convert the checkpoint again"
            ) from e
        self.description = (
            f"ctranslate2 {ctranslate2.__version__} (cpu, {compute_type}), "
            f"inter_threads={inter_threads}, intra_threads={intra_threads}"
        )
        self._source_pieces = translator.source_tokenizer.id_to_piece
        self._target_id = translator.target_tokenizer.piece_to_id
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=inter_threads, thread_name_prefix="seq2onnx-ct2"
        )

    def check(self, options: dict, texts: int = 1) -> SearchOptions:
        """As Engine.check; ValueError also for an option CTranslate2 cannot honour (UNSUPPORTED)."""
        for name, why in UNSUPPORTED.items():
            value = options.get(name)
            if value is not None and value is not False:
                raise ValueError(
                    f"{name}={value!r}: the CTranslate2 engine cannot honour it ({why}); leave it out"
                )
        return super().check(options, texts)

    def _pieces(self, text: str, options: SearchOptions) -> list[str] | None:
        """The source's pieces as our runtime encodes them (end token included); None for an empty text."""
        ids, _ = self.translator.prepare_source(text, truncate=options.truncate)
        return [self._source_pieces(i) for i in ids] if ids else None

    def _limit(self, pieces: list[str], options: SearchOptions) -> int:
        """The runtime's maximum decoding length for a source of len(pieces) ids."""
        return int(self.translator.spec.max_lengths([pieces], options)[0])

    def _translate(self, texts: list[str], options: SearchOptions) -> list[TranslationResult]:
        n = options.num_hypotheses
        pieces = [self._pieces(t, options) for t in texts]
        results: list[TranslationResult | None] = [None] * len(texts)
        by_limit: dict[int, list[int]] = {}
        for i, p in enumerate(pieces):
            if p is None:
                results[i] = TranslationResult(
                    [""] * n, [[]] * n, [0.0] * n if options.return_scores else None
                )
                continue
            limit = self._limit(p, options)
            if options.min_decoding_length >= limit:
                raise ValueError(
                    f"text {i}: min_decoding_length={options.min_decoding_length} is not below its maximum "
                    f"length {limit}: pass a larger max_decoding_length or a smaller min_decoding_length"
                )
            by_limit.setdefault(limit, []).append(i)
        # CTranslate2 takes one max_decoding_length per call: one call per distinct limit keeps each
        # sentence's own limit (cutting a longer search afterwards is exact for greedy only).
        for limit, rows in by_limit.items():
            found = self.ct2.translate_batch(
                [pieces[i] for i in rows],
                beam_size=options.beam_size,
                num_hypotheses=n,
                length_penalty=options.length_penalty,
                max_decoding_length=limit,
                # prepare_source checked it
                min_decoding_length=options.min_decoding_length,
                max_input_length=0,
                max_batch_size=options.max_batch_size,
                batch_type="examples",
                return_scores=options.return_scores,
                # to tell a finished hypothesis from one cut at the limit (its score's length)
                return_end_token=True,
            )
            for i, r in zip(rows, found):
                full = [[self._target_id(p) for p in h] for h in r.hypotheses]
                ids = [h[:-1] if h and h[-1] == self.translator.eos_id else h for h in full]
                # CTranslate2's score is the sum of log-probabilities / length^length_penalty (end token
                # counted), for greedy search too; ours is the sum: multiplied back.
                scores = (
                    [float(s) * max(len(h), 1) ** options.length_penalty for s, h in zip(r.scores, full)]
                    if options.return_scores
                    else None
                )
                results[i] = TranslationResult([self.translator.detokenize(t) for t in ids], ids, scores)
        return results  # type: ignore[return-value]

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        return self._on_pool(self._pool, texts, options, lambda job: self._translate(texts, options))

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        """Greedy pieces from ctranslate2.Translator.generate_tokens, detokenised as the runtime does."""
        pieces = self._pieces(text, options)
        if pieces is None:
            return
        limit = self._limit(pieces, options)
        self._count(1, options, +1)
        try:
            steps = self.ct2.generate_tokens(
                pieces,
                max_decoding_length=limit,
                max_input_length=0,
                min_decoding_length=options.min_decoding_length,
            )

            def ids():
                for step in steps:
                    if job.cancelled.is_set():
                        return
                    if step.token_id == self.translator.eos_id:
                        return
                    yield self._target_id(step.token)

            yield from text_increments(self.translator.detokenize, ids())
        finally:
            self._count(1, options, -1)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class EchoEngine(Engine):
    """Answers each text with itself (every hypothesis) and its source ids without the end token, at once.

    It tokenises as the real engines do (Translator.prepare_source) and checks options with Engine.check, so
    a request costs what the front end, JSON and tokenisation cost: the ceiling of any engine behind it.
    """

    batching = "echo"

    def submit(self, texts: list[str], options) -> Job:
        job = Job()
        try:
            out = []
            for text in texts:
                ids, _ = self.translator.prepare_source(text, truncate=options.truncate)
                ids, n = [int(i) for i in ids[:-1]], options.num_hypotheses
                scores = [0.0] * n if options.return_scores else None
                out.append(TranslationResult([text] * n, [ids] * n, scores))
            job.future.set_result(out)
        except Exception as e:  # the front end answers it (422 or 500)
            job.future.set_exception(e)
        return job

    def stream(self, text: str, options, job: Job):
        yield text


def build_parser() -> argparse.ArgumentParser:
    """The command line of this script (its --help)."""
    p = argparse.ArgumentParser(
        description="Serve CTranslate2 (or --echo) behind seq2onnx serve's front end."
    )
    p.add_argument("bundle", type=Path, help="the bundle: its tokenizers, length rule and option defaults")
    p.add_argument("ct2_model", type=Path, nargs="?", help="the CTranslate2 model of the same checkpoint")
    p.add_argument("--echo", action="store_true", help="serve EchoEngine (no CT2_MODEL_DIR): the ceiling")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8000, help="0: a free port (the line printed at start names it)"
    )
    p.add_argument("--inter-threads", type=int, default=1, help="requests decoded at once (default 1)")
    p.add_argument("--intra-threads", type=int, default=2, help="threads per request (default 2)")
    p.add_argument("--compute-type", default="float32", choices=COMPUTE_TYPES, help="CTranslate2's (float32)")
    p.add_argument("--processes", type=int, default=1, help="server processes on the port (seq2onnx serve's)")
    p.add_argument("--max-queue", type=int, default=256, help="requests admitted at once, else 503 (256)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take (default 60)")
    return p


def make_app(args):
    """The app this script serves: the bundle's tokenizers and checks, CTranslate2 (or echo), the front end.

    Raises:
        BundleError, ValueError: a bad bundle, model or option (the message names it).
    """
    from seq2onnx.serve.app import create_app

    translator = Translator(args.bundle, device="cpu", intra_threads=1)
    if args.echo:
        return create_app(EchoEngine(translator), max_queue=args.max_queue, timeout_s=args.timeout)
    if args.ct2_model is None:
        raise ValueError("give CT2_MODEL_DIR (seq2onnx export CKPT DIR --format ctranslate2), or --echo")
    threads = dict(inter_threads=args.inter_threads, intra_threads=args.intra_threads)
    engine = CT2Engine(translator, args.ct2_model, **threads, compute_type=args.compute_type)
    print(f"serve_ct2: {engine.description}", file=sys.stderr, flush=True)
    try:
        return create_app(engine, max_queue=args.max_queue, timeout_s=args.timeout)
    except BaseException:
        engine.close()
        raise


def main(argv: list[str] | None = None) -> int:
    """Loads the bundle and the CTranslate2 model, then serves until SIGTERM or Ctrl-C.

    Returns:
        0 after a clean stop (serve/server.py's status); 2 for a bad argument, model or port (the message on
        stderr).
    """
    args = build_parser().parse_args(argv)
    from seq2onnx.errors import CommandError
    from seq2onnx.runtime.bundle import BundleError
    from seq2onnx.serve.processes import serve_processes
    from seq2onnx.serve.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s seq2onnx serve: %(message)s")
    try:
        if args.processes > 1:  # each process loads its own model (make_app), as seq2onnx serve's do
            app = functools.partial(make_app, args)
            return serve_processes(app, args.processes, host=args.host, port=args.port)
        return serve(make_app(args), host=args.host, port=args.port)
    except (BundleError, CommandError, ValueError) as e:
        print(f"serve_ct2: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
