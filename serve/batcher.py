"""Continuous batching: one scheduler runs the decoder step over the rows of every request at once.

Each request is translated by the runtime's own code (Translator.translate_batch, generate_tokens)
on a worker thread, unchanged but for its step: instead of running the decoder graph itself, the
step (a Member) hands its rows to the Scheduler and waits. The scheduler waits until every member
has handed in its rows (the step boundary), runs decoder.onnx ONCE over all of them, and hands each
member its own rows of the output. So:
- a new request's sentences are encoded (by its thread, batched among themselves as translate_batch
  batches them) and join the running batch at the next step boundary;
- a finished sentence leaves at once (the search drops it, `keep`); a request is answered as soon
  as its last sentence finishes; a cancelled one raises at its next step and its rows leave;
- the search (greedy, beam with a sentence's beams together, n-best, scores, sampling, forced
  prefixes) is runtime/search.py's own, so a sentence's result is what translate_batch gives, up to
  the arithmetic of the graph on a batch of another shape (docs/serving.md#continuous-batching).

The rows of a round sit at different steps. decoder.onnx takes each row's own step (`step` of shape
[rows], Transformer.decode_step): row r's cached positions are the LAST step[r] slots of the shared
cache, right-aligned, since every round appends one slot for every row; the slots before them are
masked (layers.own_past_bias). A new row continues any row (all its slots are masked). The cross
keys and values are given per row (a sentence's copied for each of its beams): rows of a greedy
and of a beam request, or of sources of different lengths, share one graph run.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import itertools
import threading
from typing import Iterator

import numpy as np

from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.options import SearchOptions
from seq2onnx.runtime.search import TopK
from seq2onnx.runtime.translator import Translator

from .engine import Cancelled, Engine, Job


class RoundFailed(RuntimeError):
    """The decoder graph failed on a round: every request in it is answered 500 (not its own fault: no 422)."""


class NoServingDecoder(ValueError):
    """The bundle's decoder.onnx takes one step for all rows (exported before serve/ existed)."""


def _check_decoder(session, bundle_path) -> None:
    step = next(i for i in session.get_inputs() if i.name == names.STEP)
    if step.shape == [1]:
        raise NoServingDecoder(
            f"{bundle_path}: its decoder.onnx takes one step for all rows (input {names.STEP!r} of shape [1]): it was "
            "exported before continuous batching. Export the checkpoint again with `seq2onnx export`, or serve this "
            "bundle with --batching request")


_SERIALS = itertools.count()  # a member's key in the scheduler's caches (an id() may be reused)


class Member:
    """One search's rows in the shared batch: the step callable its search drives (runtime/search.py).

    Args:
        scheduler: the Scheduler that runs the rounds.
        job: the request's Job (its cancel flag is read at every step).
        src_mask: (B, S) bool, the encoder's mask of this search's sources.
        cross: per layer and kind (B, H, S, Dh), the encoder's keys and values.
        top_k: candidates per row the search needs, or None for the full log-probabilities.
    """

    buffers = None  # Translator._recycle offers a step's buffers to its pool: a member has none

    def __init__(self, scheduler: "Scheduler", job: Job, src_mask: np.ndarray, cross: list[np.ndarray],
                 top_k: int | None):
        self.scheduler, self.job, self.top_k = scheduler, job, top_k
        self.src_mask, self.cross = src_mask, cross
        self.blocks: tuple | None = None  # (key, mask, cross): its rows' blocks of the round's cross inputs
        self.serial = next(_SERIALS)
        self.version = 0  # changes when sentences leave: the scheduler's per-row cross is then made again
        self.offset: int | None = None  # its first row in the previous round's output (None before its first step)

    def __call__(self, tokens: np.ndarray, cache_indices: np.ndarray, t: int, keep: np.ndarray | None):
        if self.job.cancelled.is_set():
            raise Cancelled("the request was cancelled")
        if keep is not None:  # finished sentences leave: their encoder outputs go too
            self.cross = [c[keep] for c in self.cross]
            self.src_mask = self.src_mask[keep]
            self.version += 1
        return self.scheduler.step(self, np.asarray(tokens, dtype=np.int64).reshape(-1),
                                   np.asarray(cache_indices, dtype=np.int64).reshape(-1), t)


class Scheduler:
    """Runs the decoder graph over the rows of every active Member, one round per step boundary.

    There is no scheduler thread: the member whose rows complete a step boundary (every member has
    handed in its rows) runs the round on its own thread while the others wait, then wakes them.
    One request alone thus runs its steps on its own thread, as Translator.translate_batch would,
    with no hand-over between threads per step.

    Args:
        decoder: the onnxruntime session of decoder.onnx (per-row steps: NoServingDecoder otherwise).
        n_layers, n_heads, head_dim: the decoder's sizes.
        cache_dtype: numpy dtype of the cache.
        vocab: the target vocabulary's size.
        to_device: numpy array -> OrtValue on the session's device; device: "cpu" or "cuda", where the cache stays.
    """

    def __init__(self, decoder, *, n_layers: int, n_heads: int, head_dim: int, cache_dtype, vocab: int,
                 to_device=None, device: str = "cpu"):
        import onnxruntime

        self._to = to_device or onnxruntime.OrtValue.ortvalue_from_numpy
        self.device = device
        self.decoder, self.n_layers, self.n_heads, self.head_dim = decoder, n_layers, n_heads, head_dim
        self.cache_dtype, self.vocab = cache_dtype, vocab
        self._cond = threading.Condition()
        self._members: list[Member] = []  # registration order: the rows' order in a round
        self._pending: dict[Member, tuple] = {}
        self._answers: dict[Member, object] = {}
        self._running = False  # a round is under way (on some member's thread)
        self._past: list | None = None  # the previous round's present_* OrtValues
        self._cross_key = None
        self._cross: tuple = ()
        self._closed = False
        self.rounds = 0
        self.last_rows = 0

    def join(self, member: Member) -> None:
        """Adds a member: the next round waits for its rows."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._members.append(member)

    def leave(self, member: Member) -> None:
        """Removes a member (its search ended, or raised): rounds no longer wait for it. Idempotent."""
        with self._cond:
            if member in self._members:
                self._members.remove(member)
                self._pending.pop(member, None)
                if not self._members:  # nobody reads the cache or the cross inputs any more
                    self._past, self._cross_key, self._cross = None, None, ()
                self._cond.notify_all()  # the others may now all be waiting: one of them runs the round

    def step(self, member: Member, tokens: np.ndarray, cache_indices: np.ndarray, t: int):
        """Hands in a member's rows and returns its output (log-probabilities or a TopK) once its round ran."""
        with self._cond:
            if member not in self._members:
                raise RuntimeError("a member stepped after leaving (or before joining) the scheduler")
            self._pending[member] = (tokens, cache_indices, t)
            while member not in self._answers:
                if not self._running and len(self._pending) == len(self._members):
                    self._lead()  # this thread completes the step boundary: it runs the round
                else:
                    self._cond.wait()
            answer = self._answers.pop(member)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _lead(self) -> None:
        """Runs one round over every pending member; called holding the lock, releases it meanwhile."""
        work = [(m, *self._pending.pop(m)) for m in self._members]
        self._running = True
        self._cond.release()
        try:
            answers = self._round(work)
        except BaseException as e:  # every member of the round gets the error, as a fault of the server
            answers = {m: RoundFailed(f"the decoder step failed: {type(e).__name__}: {e}") for m, *_ in work}
            self._past = None
            for m, *_ in work:
                m.offset = None
        finally:
            self._cond.acquire()
        self._answers.update(answers)
        self._running = False
        self._cond.notify_all()

    def close(self) -> None:
        """Refuses new members (those decoding finish)."""
        with self._cond:
            self._closed = True

    def load(self) -> dict:
        """{"active_searches": members now, "active_rows": rows of the last round}."""
        with self._cond:
            return {"active_searches": len(self._members), "active_rows": self.last_rows}

    def _round(self, work: list) -> dict:
        rows = [len(tokens) for _, tokens, _, _ in work]
        total = sum(rows)
        starts = np.cumsum([0, *rows[:-1]])
        past = self._trimmed_past(max(t for *_, t in work))
        prev_rows = past[0].shape()[0]
        indices = np.zeros(total, dtype=np.int64)
        steps = np.empty(total, dtype=np.int64)
        for (m, _, local, t), start, n in zip(work, starts, rows):
            steps[start:start + n] = t
            if t > 0:
                if m.offset is None:
                    raise RuntimeError("a member at step > 0 has no rows in the previous round")
                indices[start:start + n] = m.offset + local
            # else: a first step; any row will do (its cached slots are all masked): row 0
        if indices.max(initial=0) >= prev_rows:
            raise RuntimeError(f"cache row {int(indices.max())} of {prev_rows}: a member skipped a round")
        tokens = np.concatenate([tok for _, tok, _, _ in work])[:, None]
        k_wanted = [m.top_k for m, *_ in work if m.top_k is not None]
        top_k = max(k_wanted, default=1)
        full = any(m.top_k is None for m, *_ in work)
        src_mask, cross = self._per_row_cross(work, rows)

        b = self.decoder.io_binding()
        b.bind_cpu_input(names.TOKENS, tokens)
        b.bind_cpu_input(names.STEP, steps)
        b.bind_cpu_input(names.CACHE_INDICES, indices)
        b.bind_cpu_input(names.TOP_K, np.array([top_k], dtype=np.int64))
        for name, value in zip(names.past_names(self.n_layers), past):
            b.bind_ortvalue_input(name, value)
        for name, value in zip(names.cross_names(self.n_layers), cross):
            b.bind_ortvalue_input(name, value)
        b.bind_ortvalue_input(names.SRC_MASK, src_mask)
        present = names.present_names(self.n_layers)
        for name in present:
            b.bind_output(name, self.device)  # the cache stays where the graph runs
        wanted = ([names.LOG_PROBS] if full else []) + ([names.TOPK_LOG_PROBS, names.TOPK_IDS] if k_wanted else [])
        for name in wanted:
            b.bind_output(name, "cpu")
        self.decoder.run_with_iobinding(b)
        out = b.get_outputs()
        self._past = out[: len(present)]
        got = dict(zip(wanted, (o.numpy() for o in out[len(present):])))
        self.rounds += 1
        self.last_rows = total
        answers = {}
        for (m, *_), start, n in zip(work, starts, rows):
            m.offset = int(start)
            if m.top_k is None:
                answers[m] = got[names.LOG_PROBS][start:start + n]
            else:
                answers[m] = TopK(got[names.TOPK_LOG_PROBS][start:start + n, : m.top_k],
                                  got[names.TOPK_IDS][start:start + n, : m.top_k], self.vocab)
        return answers

    def _trimmed_past(self, needed: int) -> list:
        """The previous round's cache, its leading slots cut when no row of this round reads them."""
        shape = (1, self.n_heads, 0, self.head_dim)
        if self._past is None:
            return [self._to(np.zeros(shape, dtype=self.cache_dtype)) for _ in range(2 * self.n_layers)]
        length = self._past[0].shape()[2]
        # Cutting copies the whole cache (as each round's Concat does): only once enough slots are idle.
        if length - needed >= max(4, needed // 4):
            self._past = [self._to(np.ascontiguousarray(v.numpy()[:, :, length - needed:])) for v in self._past]
        return self._past

    def _per_row_cross(self, work: list, rows: list[int]) -> tuple:
        """src_mask (R, S) and the cross keys/values (R, H, S, Dh) of the round's rows, S the longest
        source; made again only when the rows' sentences change (a member joins, leaves, or drops one)."""
        key = tuple((m.serial, m.version, n) for (m, *_), n in zip(work, rows))
        if key == self._cross_key:
            return self._cross
        total, longest = sum(rows), max(m.src_mask.shape[1] for m, *_ in work)
        mask = np.zeros((total, longest), dtype=bool)
        cross = [np.zeros((total, self.n_heads, longest, self.head_dim), dtype=self.cache_dtype)
                 for _ in range(2 * self.n_layers)]
        start = 0
        for (m, *_), n in zip(work, rows):
            if m.blocks is None or m.blocks[0] != (m.version, n):  # a member's own rows: repeated once per change
                per = n // m.src_mask.shape[0]  # rows per sentence: its live beams (1 for greedy)
                m.blocks = ((m.version, n), np.repeat(m.src_mask, per, axis=0), [np.repeat(c, per, axis=0) for c in m.cross])
            _, block_mask, block_cross = m.blocks
            s = block_mask.shape[1]
            mask[start:start + n, :s] = block_mask
            for out, c in zip(cross, block_cross):
                out[start:start + n, :, :s] = c
            start += n
        self._cross_key, self._cross = key, (self._to(mask), [self._to(c) for c in cross])
        return self._cross


class ContinuousEngine(Engine):
    """serve/engine.py's Engine with continuous batching (the module docstring).

    Args:
        translator: the Translator of the bundle served; its decoder.onnx must take per-row steps.
        max_workers: requests decoded at once (each on its own thread, its rows in the shared batch).
        max_rows: as Engine's.
    Raises:
        NoServingDecoder: a bundle exported before continuous batching (the message says what to do).
    """

    batching = "continuous"

    def __init__(self, translator: Translator, max_workers: int = 1024, max_rows: int = 1024):
        super().__init__(translator, max_rows)
        decoder = translator._standard_decoder
        _check_decoder(decoder, translator.bundle.path)
        self.scheduler = Scheduler(decoder, n_layers=translator.n_layers, n_heads=translator.n_heads,
                                   head_dim=translator.head_dim, cache_dtype=translator.cache_dtype,
                                   vocab=translator.tgt_vocab, to_device=translator._to_device,
                                   device=translator._ort_device)
        # The runtime's own code drives each request; only its step and its recycling are ours.
        self._view = view = copy.copy(translator)
        view._step_fn, view._recycle = self._member, self._leave
        self._local = threading.local()  # the job of the request this thread decodes
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="seq2onnx-job")
        self._lock = threading.Lock()
        self._jobs: dict[int, int] = {}  # id(job) -> its sentences, while decoding

    def _member(self, src, lengths, top_k, *, max_length: int, beam_width: int = 1, encoded=None) -> Member:
        src_mask, cross = encoded if encoded is not None else self.translator._encode(src, lengths)
        member = Member(self.scheduler, self._local.job, src_mask.numpy(), [c.numpy() for c in cross], top_k)
        self._local.members.append(member)
        self.scheduler.join(member)
        return member

    def _leave(self, step) -> None:
        self.scheduler.leave(getattr(step, "inner", step))  # inner: under force_prefix

    @contextlib.contextmanager
    def _decoding(self, job: Job, sentences: int):
        """This thread decodes `job` inside the block; whatever happens, the members it made leave the rounds."""
        members = self._local.members = []  # this list object: a stream may be resumed on another thread
        self._local.job = job
        with self._lock:
            self._jobs[id(job)] = sentences
        try:
            yield
        finally:
            for m in members:
                self.scheduler.leave(m)
            if self._local.members is members:  # a pool thread keeps no finished job (nor its encoder outputs)
                self._local.job, self._local.members = None, []
            with self._lock:
                self._jobs.pop(id(job), None)

    def submit(self, texts: list[str], options: SearchOptions) -> Job:
        job = Job()

        def work():
            try:
                if job.cancelled.is_set():  # left while queued: not even encoded
                    raise Cancelled("cancelled before decoding")
                with self._decoding(job, len(texts)):
                    result = self._view._translate(texts, options)
                job.future.set_result(result)
            except BaseException as e:  # the job carries it (Cancelled included)
                job.future.set_exception(e)

        self._pool.submit(work)
        return job

    def stream(self, text: str, options: SearchOptions, job: Job) -> Iterator[str]:
        with self._decoding(job, 1):
            yield from self._view._stream_text(text, options)

    def load(self) -> dict:
        with self._lock:
            requests, sentences = len(self._jobs), sum(self._jobs.values())
        return {"active_requests": requests, "active_sentences": sentences,
                "active_rows": self.scheduler.load()["active_rows"] if requests else 0}

    def close(self) -> None:
        self.scheduler.close()
        self._pool.shutdown(wait=True)
