"""API keys for `seq2onnx serve --api-keys FILE`: hashed keys compared in constant time, and per-key fairness.

The file holds one key a line, never the key itself but its SHA-256 (the keys are random tokens of 256 bits,
so a plain hash cannot be reversed by guessing), with the key's own limits where they differ from the
server's defaults (--key-in-flight, --key-per-minute):

    # name   hash                  limits (optional)
    alice    sha256:9f86d081...    in_flight=4 per_minute=120 characters=500000

A presented key is hashed and compared with every stored hash by hmac.compare_digest, so the time taken
says nothing about how close a guess was. Each key has its own bounds, checked before its request takes a
queue slot: requests in flight, requests per minute (a token bucket holding ten seconds' worth, refilled
continuously: 429 with Retry-After), and optionally characters since the start (DeepL's 456).
SIGHUP re-reads the file; a file that fails to parse leaves the keys as they were (the log says why).
/metrics counts per key under a label that is a prefix of the key's hash, never its name or the key.

Make a key: `python -m seq2onnx.serve.keys NAME` prints a new key and the file's line for it.
docs/drop-in-apis.md.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("seq2onnx.serve")

PREFIX = "sha256:"
LIMIT_NAMES = ("in_flight", "per_minute", "characters")
_HEX = re.compile(r"[0-9a-f]{64}")


def digest(key: str) -> bytes:
    """The SHA-256 of a key (what the keys file stores, in hex after `sha256:`)."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def line_for(name: str, key: str, **limits: int) -> str:
    """The keys file's line for `key` under `name`, with optional limits (in_flight=, per_minute=, ...)."""
    extra = "".join(f" {k}={v}" for k, v in limits.items() if v is not None)
    return f"{name} {PREFIX}{digest(key).hex()}{extra}"


@dataclass(frozen=True)
class Key:
    """One key of the file: its name, hash and limits (characters None: no quota)."""

    name: str
    hash: bytes
    in_flight: int
    per_minute: int
    characters: int | None = None

    @property
    def label(self) -> str:
        """The key's /metrics label: the first 12 hex digits of its hash (neither the key nor its name)."""
        return self.hash.hex()[:12]


def read_keys(path: Path, in_flight: int, per_minute: int) -> list[Key]:
    """Parses a keys file.

    Raises:
        ValueError: naming the file, the line and what is wrong with it.
    """
    keys, names = [], set()
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        if len(words) < 2 or not words[1].startswith(PREFIX) or not _HEX.fullmatch(words[1][len(PREFIX) :]):
            # the line itself is not shown: in a wrong file it may be a secret
            raise ValueError(
                f"{where}: not a key line; give `NAME sha256:HEX [in_flight=N] [per_minute=N] "
                "[characters=N]` (make one with `python -m seq2onnx.serve.keys NAME`)"
            )
        if words[0] in names:
            raise ValueError(f"{where}: the name {words[0]!r} is used twice: give each key its own name")
        limits = dict(in_flight=in_flight, per_minute=per_minute, characters=None)
        for word in words[2:]:
            option, _, value = word.partition("=")
            if option not in LIMIT_NAMES or not value.isdigit() or int(value) < 1:
                raise ValueError(f"{where}: {word!r}: give {'=N, '.join(LIMIT_NAMES)}=N with N >= 1")
            limits[option] = int(value)
        names.add(words[0])
        keys.append(Key(words[0], bytes.fromhex(words[1][len(PREFIX) :]), **limits))
    return keys


def burst(per_minute: int) -> float:
    """The token bucket's size: ten seconds' worth of a per-minute limit (at least 1), so that a key keeps to
    its rate within seconds rather than spending a whole minute's allowance at once."""
    return max(1.0, per_minute / 6.0)


@dataclass
class Refusal:
    """Why a request is refused by the keys: `why` is one of missing, wrong, in_flight, per_minute,
    characters; retry_after in seconds for 429s."""

    why: str
    message: str
    retry_after: int | None = None


@dataclass
class _Use:
    """One key's use now: requests in flight, the token bucket, characters translated since the start."""

    in_flight: int = 0
    tokens: float = math.inf
    stamp: float = field(default_factory=time.monotonic)
    characters: int = 0


class Gate:
    """The server's keys and each key's use. Without a file (path None) every request is let in.

    Args:
        path: the keys file, or None for an open server.
        in_flight, per_minute: the limits of a key whose line sets none.
        registry: where its metrics go (the app's).
    """

    def __init__(self, path: str | Path | None, in_flight: int, per_minute: int, registry: CollectorRegistry):
        self.path = None if path is None else Path(path)
        self.in_flight, self.per_minute = in_flight, per_minute
        self.keys: list[Key] = [] if self.path is None else read_keys(self.path, in_flight, per_minute)
        self._use: dict[str, _Use] = {}  # by name: a reload keeps a key's use
        self._lock = threading.Lock()
        self.open_characters = 0  # translated on an open server (DropIn.translate counts them)
        self.requests = Counter(
            "seq2onnx_key_requests",
            "requests by API key (a prefix of its hash) and "
            "outcome (admitted, in_flight, per_minute, characters)",
            ["key", "outcome"],
            registry=registry,
        )
        self.refused = Counter(
            "seq2onnx_key_refusals",
            "requests refused for their key: missing or wrong",
            ["why"],
            registry=registry,
        )
        self.active = Gauge(
            "seq2onnx_key_in_flight",
            "requests in flight by API key (a prefix of its hash)",
            ["key"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.characters = Counter(
            "seq2onnx_key_characters", "characters translated by API key", ["key"], registry=registry
        )

    @property
    def open(self) -> bool:
        """True without --api-keys: every request is let in."""
        return self.path is None

    def reload(self) -> None:
        """Re-reads the keys file; a file that fails to parse leaves the keys as they were (logged)."""
        try:
            keys = read_keys(self.path, self.in_flight, self.per_minute)
        except (OSError, ValueError) as e:
            log.error("--api-keys: not reloaded, the keys stay as they were: %s", e)
            return
        self.keys = keys  # one assignment: a request sees the old list or the new one
        log.info("--api-keys: reloaded %s: %d keys", self.path, len(keys))

    def identify(self, presented: str | None) -> Key | Refusal:
        """The key matching `presented` (compared with every stored hash in constant time), or the refusal."""
        if not presented:
            self.refused.labels("missing").inc()
            return Refusal("missing", "no API key was given")
        h, found = digest(presented), None
        for key in self.keys:  # every hash compared, whichever matches
            if hmac.compare_digest(h, key.hash):
                found = key
        if found is None:
            self.refused.labels("wrong").inc()
            return Refusal("wrong", "the API key is not valid here")
        return found

    def admit(self, key: Key) -> Refusal | None:
        """Takes one in-flight slot and one token of `key`, or returns the 429/456 refusal (nothing taken)."""
        with self._lock:
            use = self._use.setdefault(key.name, _Use())
            now = time.monotonic()
            rate = key.per_minute / 60.0
            use.tokens = min(burst(key.per_minute), use.tokens + (now - use.stamp) * rate)
            use.stamp = now
            refusal = None
            if key.characters is not None and use.characters >= key.characters:
                refusal = Refusal("characters", f"this key's quota of {key.characters} characters is used up")
            elif use.in_flight >= key.in_flight:
                refusal = Refusal(
                    "in_flight",
                    f"this key already has {use.in_flight} requests in "
                    f"flight, its limit: wait for an answer before sending more",
                    1,
                )
            elif use.tokens < 1.0:
                wait = math.ceil((1.0 - use.tokens) / rate)
                refusal = Refusal(
                    "per_minute",
                    f"this key sent more than its {key.per_minute} requests per minute: retry after {wait} s",
                    wait,
                )
            else:
                use.in_flight += 1
                use.tokens -= 1.0
        self.requests.labels(key.label, "admitted" if refusal is None else refusal.why).inc()
        if refusal is None:
            self.active.labels(key.label).inc()
        return refusal

    def release(self, key: Key, characters: int = 0) -> None:
        """Gives back the slot that admit() took; counts the characters translated."""
        with self._lock:
            use = self._use[key.name]
            use.in_flight -= 1
            use.characters += characters
        self.active.labels(key.label).dec()
        if characters:
            self.characters.labels(key.label).inc(characters)

    def usage(self, key: Key | None) -> tuple[int, int | None]:
        """(characters translated since the start, the key's quota or None) of a key."""
        if key is None:
            return self.open_characters, None
        with self._lock:
            return self._use.get(key.name, _Use()).characters, key.characters


def reload_on_sighup(gate: Gate) -> None:
    """Makes SIGHUP re-read the keys file (from the main thread only, where Python runs signal handlers)."""
    main = threading.current_thread() is threading.main_thread()
    if gate.open or not main or not hasattr(signal, "SIGHUP"):
        return
    signal.signal(signal.SIGHUP, lambda *_: gate.reload())


def main(argv: list[str]) -> int:
    """`python -m seq2onnx.serve.keys NAME [in_flight=N ...]`: a new random key on stderr, its line on stdout
    (append it to the keys file: `... >> keys.txt`); `--stdin` hashes a key read from standard input."""
    if not argv or argv[0].startswith("-") and argv[0] != "--stdin":
        print(
            "usage: python -m seq2onnx.serve.keys [--stdin] NAME [in_flight=N] [per_minute=N] [characters=N]",
            file=sys.stderr,
        )
        return 2
    given = argv[0] == "--stdin"
    name, words = (argv[1], argv[2:]) if given else (argv[0], argv[1:])
    key = sys.stdin.readline().strip() if given else secrets.token_urlsafe(32)
    limits = dict(word.split("=", 1) for word in words)
    if not given:
        print(f"key for {name} (give it to the client; only its hash is kept): {key}", file=sys.stderr)
    print(line_for(name, key, **limits))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
