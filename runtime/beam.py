"""Beam search in numpy, batched over sentences, over a step callable (runtime/search.py's conventions).

beam_program is a search program (runtime/search.py): a generator that yields each step's request and is
sent the step's output. Its state (Beams) is in the open, so that the serving scheduler can advance many
programs by one round's output at once (advance_together): their candidates are ranked in one pass over
every row, and each program then finishes, continues and drops its sentences as it would alone.
"""

from __future__ import annotations

import collections.abc

import numpy as np

from .search import BEAM_CONVENTIONS, EARLY_STOPPING, SearchResult, Step, TopK, _check, run


def _top_candidates(total: np.ndarray, n: int) -> np.ndarray:
    """Per row, the flat indices of the n largest values, ordered by (value desc, index asc)."""
    if n < total.shape[1]:
        part = np.argpartition(-total, n - 1, axis=1)[:, :n]
        chosen = np.take_along_axis(total, part, axis=1)
        threshold = chosen.min(axis=1, keepdims=True)
        # A tie at the threshold may have taken a higher index over a lower one: redo those rows
        # with a full stable sort (rare: exact float ties or -inf from a forbidden end token).
        tied = (total == threshold).sum(axis=1) != (chosen == threshold).sum(axis=1)
        for row in np.flatnonzero(tied):
            part[row] = np.argsort(-total[row], kind="stable")[:n]
    else:
        part = np.broadcast_to(np.arange(total.shape[1]), total.shape).copy()
    values = np.take_along_axis(total, part, axis=1)
    order = np.lexsort((part, -values), axis=1)
    return np.take_along_axis(part, order, axis=1)


def beam_search(step: Step, batch: int, **options) -> list[SearchResult]:
    """Beam search: run(beam_program(batch, **options), step); the step must give at least 2K candidates per
    row."""
    return run(beam_program(batch, **options), step)


def beam_program(
    batch: int,
    *,
    beam_size: int,
    start_id: int,
    eos_id: int,
    max_lengths: np.ndarray,
    min_length: int = 0,
    length_penalty: float = 1.0,
    num_hypotheses: int = 1,
    convention: str = "fairseq",
) -> BeamProgram:
    """Beam search as a program over `batch` sentences at once; each sentence finishes on its own.

    Args:
        batch: the number of sentences.
        beam_size: K.
        start_id, eos_id: the first decoder input and the end token.
        max_lengths: per sentence, the tokens it may generate (end token included).
        min_length: the end token is forbidden before this many tokens.
        length_penalty: alpha of the ranking score / len^alpha.
        num_hypotheses: the n-best per sentence, 1..K.
        convention: "fairseq" (a finishing candidate takes a free place among the K, docs/decoding.md) or
            one of generate()'s (the K best by normalised score of those finished so far and this step's,
            which may displace one finished earlier), which stop a sentence as its early_stopping does
            (EARLY_STOPPING): "transformers" (True) once K have finished; "transformers_heuristic" (False) and
            "transformers_never" ("never") once the best live beam's score / len^alpha is no better than the
            worst finished one's, len being the tokens generated so far, or for "never" with alpha > 0 the
            sentence's max length (_check_early_stop_heuristic); bundle.json's decoding.beam_convention.

    Returns:
        (as the program's result) One SearchResult per sentence, best first.

    Raises:
        ValueError: impossible settings (at the first request), or a vocabulary or step with fewer than 2K
            candidates.
    """
    return BeamProgram(
        batch,
        beam_size=beam_size,
        start_id=start_id,
        eos_id=eos_id,
        max_lengths=max_lengths,
        min_length=min_length,
        length_penalty=length_penalty,
        num_hypotheses=num_hypotheses,
        convention=convention,
    )


class BeamProgram(collections.abc.Generator):
    """beam_program's program: a generator whose state (`state`, a Beams once started) is in the open, so that
    the serving scheduler may advance many at once (advance_together, below) exactly as each
    would advance alone. As a generator: the first next() checks the settings and yields the first request;
    send(out) advances by a step's output and yields the next request, or raises StopIteration with the
    results. Its arguments are beam_program's."""

    def __init__(self, batch: int, *, num_hypotheses: int = 1, **settings):
        self.batch, self.num_hypotheses, self.settings = batch, num_hypotheses, settings
        self.state: Beams | None = None
        self.ended = False

    def send(self, out):
        if self.ended:
            raise StopIteration
        if self.state is None and out is not None:
            raise TypeError("can't send non-None value to a just-started generator")
        try:
            if self.state is None:
                self.state = self._start()
            else:
                self.state.advance(out)
        except BaseException:  # as a generator's frame, an error ends the program
            self.ended = True
            raise
        return self.request()

    def request(self) -> tuple:
        """The next step's request (tokens, cache_indices, t, keep); StopIteration(results) once every
        sentence is done."""
        b = self.state
        if not b.alive.size:
            self.ended = True
            raise StopIteration(b.results(self.num_hypotheses))
        return b.tokens, b.cache_indices, b.t, b.keep

    def throw(self, typ=None, value=None, traceback=None):
        self.ended = True
        raise typ if value is None else value

    def close(self) -> None:
        self.ended = True

    def _start(self) -> Beams:
        s = self.settings  # beam_program's, every one given (its defaults are the only ones)
        beam_size, convention = s["beam_size"], s["convention"]
        max_lengths, min_length = np.asarray(s["max_lengths"], dtype=np.int64), s["min_length"]
        _check(beam_size, max_lengths, min_length)
        if convention not in BEAM_CONVENTIONS:
            raise ValueError(f"convention={convention!r}; choose one of {', '.join(BEAM_CONVENTIONS)}")
        if not 1 <= self.num_hypotheses <= beam_size:
            raise ValueError(f"num_hypotheses={self.num_hypotheses} must lie in [1, beam_size={beam_size}]")
        return Beams(
            self.batch,
            beam_size,
            s["start_id"],
            s["eos_id"],
            max_lengths,
            min_length,
            s["length_penalty"],
            convention,
        )


_NEVER = np.iinfo(np.int64).max  # the least max length of no sentence


class Beams:
    """beam_program's state between two steps, and its step: the sentences still decoding (`alive`), their
    live beams' scores and tokens, the finished hypotheses of every sentence, the next request."""

    def __init__(self, batch, k, start_id, eos_id, max_lengths, min_length, length_penalty, convention):
        self.k, self.eos_id, self.max_lengths, self.min_length = k, eos_id, max_lengths, min_length
        self.length_penalty = length_penalty
        self.best_finished, self.early_stopping = convention != "fairseq", EARLY_STOPPING[convention]
        longest = int(max_lengths.max(initial=0))
        self.fin_tokens = np.zeros((batch, k, longest), dtype=np.int64)
        self.fin_lengths = np.zeros((batch, k), dtype=np.int64)
        self.fin_scores = np.full((batch, k), -np.inf)
        self.n_finished = np.zeros(batch, dtype=np.int64)
        self.alive = np.arange(batch)  # sentence ids still decoding
        self.beams = 1  # live beams per sentence: one on the first step
        self.scores = np.zeros((batch, 1))  # (B, beams) cumulative log-probabilities
        self.history = np.zeros((batch, 1, 0), dtype=np.int64)  # (B, beams, t) tokens so far
        self.tokens = np.full((batch, 1), start_id, dtype=np.int64)
        self.cache_indices = np.arange(batch, dtype=np.int64)
        self.keep = None
        self.t = 0
        self.in_top_k = np.arange(2 * k)[None, :] < k
        # for gathers along axis 1: x[rows, idx] is take_along_axis, cheaper
        self.rows = np.arange(batch)[:, None]
        self._offsets: tuple | None = None  # (beams, vocab, beam x vocab offsets of a TopK's flat indices)
        self._reach = max_lengths  # the max lengths of the sentences in `alive`
        # the least of them: before it, no sentence is at its last step
        self._soonest = int(max_lengths.min(initial=_NEVER))
        self._finished_any = False  # a hypothesis has finished: full sentences must be looked for

    def advance(self, out: np.ndarray | TopK) -> None:
        """Takes a step's output: finishes candidates that end, continues the K best that do not, drops the
        sentences that are done, and sets the next request."""
        b = self.alive.size
        self.trim_rows(b)
        cand, cand_scores, vocab = self._candidates(out, b)
        cand_beam, cand_token = np.divmod(cand, vocab)
        is_eos = cand_token == self.eos_id
        self.advance_with(cand_beam, cand_token, cand_scores, is_eos, bool(is_eos[:, : self.k].any()))

    def trim_rows(self, b: int) -> None:
        """The row index of `b` live sentences (sentences left: a new index only then)."""
        if self.rows.shape[0] != b:
            self.rows = self.rows[:b]

    def advance_with(self, cand_beam, cand_token, cand_scores, is_eos, eos_in_top: bool) -> None:
        """advance() from each live sentence's 2K best candidates, best first (ties: lower flat index): their
        beams, tokens, scores and end-token flags (b, 2K), and whether an end token is among any sentence's
        first K (runtime/beam_rounds.py computes these for many searches at once)."""
        b = self.alive.size
        self.trim_rows(b)
        # (b,) sentences at their last step; None before the first can be
        last = self._reach == self.t + 1 if self.t + 1 >= self._soonest else None
        k = self.k
        if eos_in_top or last is not None:
            self._finish(
                cand_beam, cand_token, cand_scores, is_eos if last is None else is_eos | last[:, None]
            )
        # 2. continue: the first K candidates that do not end
        if eos_in_top:
            cont = ~is_eos
            pick = cont & (np.cumsum(cont, axis=1) <= k)
            # at least K non-end candidates exist: each beam contributes at most one end token
            next_beam = cand_beam[pick].reshape(b, k)
            next_token = cand_token[pick].reshape(b, k)
            next_scores = cand_scores[pick].reshape(b, k)
        else:  # no end token among the first K: they are the K picked
            next_beam, next_token, next_scores = cand_beam[:, :k], cand_token[:, :k], cand_scores[:, :k]
        self.t += 1
        self._next(None if last is None else ~last, next_beam, next_token, next_scores)

    def _candidates(self, out: np.ndarray | TopK, b: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Each sentence's 2K best candidates, best first (ties: lower flat index beam x V + token): their
        flat indices, their scores, and V."""
        k, beams = self.k, self.beams
        vocab = out.vocab if isinstance(out, TopK) else out.shape[1]
        if vocab < 2 * k:
            raise ValueError(
                f"beam_size={k} needs a vocabulary of at least {2 * k} tokens, this one has {vocab}"
            )
        if not isinstance(out, TopK):
            log_probs = out.astype(np.float64)
            if self.t < self.min_length:
                log_probs[:, self.eos_id] = -np.inf
            total = (self.scores[:, :, None] + log_probs.reshape(b, beams, vocab)).reshape(b, beams * vocab)
            cand = _top_candidates(total, 2 * k)  # (b, 2K) flat indices, best first
            return cand, total[self.rows, cand], vocab
        values = out.values.astype(np.float64)
        if self.t < self.min_length:
            values = np.where(out.ids == self.eos_id, -np.inf, values)
        kk = values.shape[1]
        if kk < 2 * k:
            raise ValueError(f"the step returned {kk} candidates per row; beam_size={k} needs {2 * k}")
        if self._offsets is None or self._offsets[:2] != (beams, vocab):
            self._offsets = (beams, vocab, np.arange(beams)[None, :, None] * vocab)
        total = (self.scores[:, :, None] + values.reshape(b, beams, kk)).reshape(b, beams * kk)
        flat = (self._offsets[2] + out.ids.reshape(b, beams, kk)).reshape(b, beams * kk)
        order = np.lexsort((flat, -total), axis=1)[:, : 2 * k]
        return flat[self.rows, order], total[self.rows, order], vocab

    def _finish(self, cand_beam, cand_token, cand_scores, ends) -> None:
        """1. finish: top-K candidates that end (`ends`: the end token, or any at the sentence's last step),
        while room remains; a candidate at -inf (forced or forbidden tokens) never finishes."""
        k, t, alive, n_finished = self.k, self.t, self.alive, self.n_finished
        finishing = self.in_top_k & ends & (cand_scores > -np.inf)
        accepted = finishing & (np.cumsum(finishing, axis=1) + n_finished[alive, None] <= k)
        if (
            self.best_finished
        ):  # rows with more finishing than free places, or full ones still live: the best K
            accepted |= finishing
        for row, rank in zip(*np.nonzero(accepted)):
            sent, slot = alive[row], n_finished[alive[row]]
            if slot == k:  # transformers: this step's candidates are best first, so the worst finished may go
                norm = (
                    self.fin_scores[sent] / self.fin_lengths[sent].astype(np.float64) ** self.length_penalty
                )
                slot = int(np.argmin(norm))
                if not cand_scores[row, rank] / float(t + 1) ** self.length_penalty > norm[slot]:
                    continue
                n_finished[sent] -= 1
            self.fin_tokens[sent, slot, :t] = self.history[row, cand_beam[row, rank]]
            self.fin_tokens[sent, slot, t] = cand_token[row, rank]
            self.fin_lengths[sent, slot] = t + 1
            self.fin_scores[sent, slot] = cand_scores[row, rank]
            n_finished[sent] += 1
            self._finished_any = True

    def _next(self, still, next_beam, next_token, next_scores) -> None:
        """3. drop sentences that are done (`still`: not at their last step, or None: all), and set the next
        request."""
        if self._finished_any:
            full = self.n_finished[self.alive] == self.k
            if still is None:
                still = np.ones(full.size, dtype=bool)
            if self.early_stopping is True:
                still &= ~full
            elif full.any():
                still = self._early_stop(still, full, next_scores)
        rows = self.rows
        origin = rows * self.beams + next_beam  # (b, K) rows of this step the new beams continue
        history = np.concatenate([self.history[rows, next_beam], next_token[:, :, None]], axis=2)
        if still is None or still.all():
            self.keep = None
        else:
            self.keep = keep = np.flatnonzero(still)
            self.alive, origin, history = self.alive[keep], origin[keep], history[keep]
            next_token, next_scores = next_token[keep], next_scores[keep]
            self._reach = self._reach[keep]
            self._soonest = int(self._reach.min(initial=_NEVER))
        self.history = history
        self.beams = self.k
        self.scores = next_scores
        self.tokens = next_token.reshape(-1, 1)
        self.cache_indices = origin.reshape(-1)

    def _early_stop(self, still, full, next_scores):
        """generate()'s _check_early_stop_heuristic: can the best live beam still beat the worst finished?"""
        alpha, t = self.length_penalty, self.t
        done = np.flatnonzero(full & still)
        sents = self.alive[done]
        worst = (self.fin_scores[sents] / self.fin_lengths[sents].astype(np.float64) ** alpha).min(axis=1)
        if self.early_stopping == "never" and alpha > 0:
            reach = self.max_lengths[sents]
        else:
            reach = np.full(done.size, t)
        still[done] = next_scores[done, 0] / reach.astype(np.float64) ** alpha > worst
        return still

    def results(self, num_hypotheses: int) -> list[SearchResult]:
        """Each sentence's n-best by score / len^alpha, best first."""
        results = []
        for sent in range(self.n_finished.size):
            n = self.n_finished[sent]
            norm = (
                self.fin_scores[sent, :n]
                / self.fin_lengths[sent, :n].astype(np.float64) ** self.length_penalty
            )
            order = np.argsort(-norm, kind="stable")[:num_hypotheses]
            results.append(
                SearchResult(
                    [self.fin_tokens[sent, i, : self.fin_lengths[sent, i]].tolist() for i in order],
                    [float(self.fin_scores[sent, i]) for i in order],
                )
            )
        return results


def advance_together(programs: list[BeamProgram], outputs: list[TopK]) -> list:
    """Advances started beam programs, each by its own step output, as each program's send(output) would:
    the candidates of every row of the programs that share a beam size, beams per sentence, candidates per
    row, vocabulary and end token are ranked in one pass (the same row-wise arithmetic as Beams._candidates),
    then each program finishes, continues and drops its own sentences (Beams.advance_with).

    Args:
        programs: BeamProgram's, each started (its first request taken) and not ended.
        outputs: each program's step output, a TopK (a program given full log-probabilities is advanced
            alone by send).

    Returns:
        Per program: its next request (tokens, cache_indices, t, keep), or a StopIteration whose value is its
        results, or the exception its step raised (its own settings' error).
    """
    outcomes: list = [None] * len(programs)
    groups: dict[tuple, list[int]] = {}
    for i, (program, out) in enumerate(zip(programs, outputs)):
        b = program.state
        kk = out.values.shape[1] if isinstance(out, TopK) else 0
        if kk < 2 * b.k or out.vocab < 2 * b.k:  # alone: its send raises the error, or takes full log-probs
            outcomes[i] = _sent(program, out)
        else:
            groups.setdefault((b.k, b.beams, kk, out.vocab, b.eos_id), []).append(i)
    for (k, beams, kk, vocab, eos_id), members in groups.items():
        states = [programs[i].state for i in members]
        outs = [outputs[i] for i in members]
        sizes = [s.alive.size for s in states]
        values = np.concatenate([o.values for o in outs]).astype(np.float64)
        ids = np.concatenate([o.ids for o in outs])
        forbid = [s.t < s.min_length for s in states]
        if any(forbid):
            rows_forbidden = np.repeat(np.array(forbid), np.array(sizes) * beams)
            values = np.where((ids == eos_id) & rows_forbidden[:, None], -np.inf, values)
        total_b = sum(sizes)
        scores = np.concatenate([s.scores for s in states])  # (B, beams)
        total = (scores[:, :, None] + values.reshape(total_b, beams, kk)).reshape(total_b, beams * kk)
        offsets = np.arange(beams)[None, :, None] * vocab
        flat = (offsets + ids.reshape(total_b, beams, kk)).reshape(total_b, beams * kk)
        order = np.lexsort((flat, -total), axis=1)[:, : 2 * k]
        rows = np.arange(total_b)[:, None]
        cand, cand_scores = flat[rows, order], total[rows, order]
        cand_beam, cand_token = np.divmod(cand, vocab)
        is_eos = cand_token == eos_id
        starts = np.cumsum([0, *sizes[:-1]])
        eos_in_top = np.logical_or.reduceat(is_eos[:, :k].any(axis=1), starts).tolist()
        for i, state, at, b, eos in zip(members, states, starts.tolist(), sizes, eos_in_top):
            try:
                sl = slice(at, at + b)
                state.advance_with(cand_beam[sl], cand_token[sl], cand_scores[sl], is_eos[sl], eos)
                outcomes[i] = programs[i].request()
            except StopIteration as done:
                outcomes[i] = done
            except Exception as e:  # noqa: BLE001 - the program's own error is its answer
                programs[i].ended = True
                outcomes[i] = e
    return outcomes


def _sent(program: BeamProgram, out):
    """program.send(out) as advance_together's outcome."""
    try:
        return program.send(out)
    except StopIteration as done:
        return done
    except Exception as e:  # noqa: BLE001 - the program's own error is its answer
        return e
