"""Checks of a request's body that neither FastAPI nor the runtime make: JSON that Python's parser refuses
without a useful message or reads silently (a key given twice), and translate options that contradict each
other.

Each returns None, or (status, message, field) for serve/app.py to answer as JSON.
"""

from __future__ import annotations

import json
import sys


class _Duplicate(ValueError):
    pass


def _unique(pairs: list[tuple]) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def json_problem(body: bytes) -> tuple[int, str, str | None] | None:
    """The refusal of a body that names a key twice in one object (json.loads would keep the last silently),
    nests past the parser's recursion limit, or holds an integer past Python's digit limit; None for any other
    body (FastAPI parses and checks it, invalid JSON included)."""
    return json_checked(body)[1]


def json_checked(body: bytes) -> tuple[object, tuple[int, str, str | None] | None]:
    """The body's JSON value (None where refused or invalid) and json_problem's refusal, from one parse."""
    try:
        return json.loads(body, object_pairs_hook=_unique), None
    except _Duplicate as e:
        return None, (
            422,
            f"the key {e.args[0]!r} appears more than once in one object: send each field once",
            str(e.args[0]),
        )
    except RecursionError:
        return None, (
            400,
            (
                "the body's JSON nests too deeply for the parser (about 1000 levels); this API's deepest "
                "field, target_prefix, nests 3: send a flat object"
            ),
            None,
        )
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, None  # invalid JSON: FastAPI's parser says where
    except ValueError:
        # The one other ValueError of json.loads: an integer past Python's digit limit (int() refuses it).
        return None, (
            400,
            (
                f"the body has an integer of more than {sys.get_int_max_str_digits()} digits (the JSON "
                "parser's limit): send numbers of at most that many digits"
            ),
            None,
        )


def contradiction(fields: dict) -> tuple[int, str, str] | None:
    """The refusal (422, naming both fields) of translate options that contradict each other, among those the
    request gave (`fields`, translate_batch's names): the runtime would ignore one of them silently.

    Sampling (sampling_temperature given) draws num_hypotheses samples, one row each: it has no beams. The
    other sampling options mean nothing without it. A value equal to the field's default contradicts nothing.
    """
    temperature = fields.get("sampling_temperature")
    if temperature is not None:
        beams = fields.get("beam_size")
        if beams is not None and beams != 1:
            return (
                422,
                (
                    f"beam_size={beams} with sampling_temperature={temperature}: sampling draws "
                    "num_hypotheses samples and has no beams: leave beam_size out (or 1), or leave "
                    "sampling_temperature out to search"
                ),
                "beam_size",
            )
        return None
    for name, default, what in (
        ("seed", None, "seeds the samples"),
        ("sampling_topp", 1.0, "narrows the samples"),
        ("sampling_topk", 0, "narrows the samples"),
    ):
        value = fields.get(name, default)
        if value != default:
            return (
                422,
                (
                    f"{name}={json.dumps(value)} without sampling_temperature: it {what}, and without a "
                    "temperature the request searches instead of sampling: give sampling_temperature (> 0), "
                    f"or leave {name} out"
                ),
                name,
            )
    return None
