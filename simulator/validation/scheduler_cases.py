"""Recorded scheduler cases (the format of tests/data/vllm_v1_scheduler/README.md, and the
speculative-decoding and async kinds of tools/vllm_recorder/README.md; ``.gz`` files are read
through gzip): read and checked field by field, so a file not in the format is one error
naming FILE:LINE and the field, never a traceback or a wrong comparison."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from simulator.errors import InputError

CONFIG_FIELDS: dict[str, type] = {
    "policy": str,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "block_size": int,
    "num_blocks": int,
    "enable_prefix_caching": bool,
    "reserve_full_isl": bool,
    "long_prefill_token_threshold": int,
    "max_model_len": int,
}
REQUEST_FIELDS = (
    "id",
    "arrival_step",
    "prompt_len",
    "max_tokens",
    "eos_at",
    "priority",
    "block_hashes",
)
STEP_FIELDS = ("scheduled", "preempted", "cached", "finished", "free_blocks")
POLICIES = ("fcfs", "priority")
KINDS = ("plain", "spec", "async", "async_spec", "mm", "hybrid_swa", "hybrid_mamba")
HYBRID_CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "hybrid_swa": ("layer_pattern", "sliding_window"),
    "hybrid_mamba": (
        "layer_pattern",
        "mamba",
        "mamba_page_size_padded",
        "mamba_cache_mode",
        "mamba_block_size",
    ),
}
"""The hybrid kinds' config keys besides the plain ones, ``kind``, ``kv_groups``,
``scheduler_block_size`` and ``hash_block_size`` (tools/vllm_recorder/README.md)."""
KV_GROUP_TYPES = {
    "FullAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "MambaSpec": "mamba",
}
SPEC_CONFIG_FIELDS = (
    "num_speculative_tokens",
    "speculative_method",
    "async_scheduling",
    "acceptance_rate",
)
SPEC_STEP_FIELDS = ("scheduled", "spec", "preempted", "cached", "accepted", "finished")
MM_CONFIG_FIELDS = (
    "max_num_encoder_input_tokens",
    "encoder_cache_size",
    "disable_chunked_mm_input",
    "mm_distinct_items",
)
MM_STEP_FIELDS = (*STEP_FIELDS, "encoder", "encoder_freed", "encoder_free_slots")


@dataclass(frozen=True)
class Request:
    """One recorded request (list order = order of adding)."""

    arrival_step: int
    prompt_len: int
    max_tokens: int
    eos_at: int | None
    priority: int
    block_hashes: tuple[int, ...]
    accept: tuple[int, ...] = ()
    """Spec-decode kinds: drafts the fake model accepts at each output count."""
    mm: tuple[tuple[int, int, str], ...] = ()
    """Kind ``mm``: the prompt's items, ``(offset, length, content hash)`` in prompt order."""


@dataclass(frozen=True)
class Case:
    """One recorded run: its scheduler config, requests and every step."""

    name: str
    path: str
    line: int
    config: dict[str, Any]
    requests: tuple[Request, ...]
    steps: tuple[dict[str, Any], ...]
    """The recorded steps (kinds plain and spec) or engine-loop calls (async kinds)."""
    kind: str = "plain"
    """``plain``, ``spec``, ``async``, ``async_spec`` or ``mm`` (tools/vllm_recorder/README.md)."""


class _Bad(Exception):
    """A field that is not in the format; the reader adds FILE:LINE."""


def read_cases(path: str | Path) -> list[Case]:
    """Every case of a JSONL file; InputError ``FILE:LINE: field: reason`` on the first
    line that is not in the format."""
    file = Path(path)
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rt", encoding="utf-8") as fh:
                text = fh.read()
        else:
            text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    cases = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cases.append(_case(line, str(path), line_no))
        except _Bad as err:
            raise InputError(f"{path}:{line_no}: {err}") from None
    if not cases:
        raise InputError(f"{path}: no cases in the file")
    return cases


def _case(line: str, path: str, line_no: int) -> Case:
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError, ValueError) as err:
        raise _Bad(f"invalid JSON ({err})") from None
    kind = data.get("kind", "plain") if isinstance(data, dict) else "plain"
    if kind not in KINDS:
        raise _Bad(f"field 'kind': {kind!r} is not one of {', '.join(KINDS)}")
    many = "calls" if kind.startswith("async") else "steps"
    top = ("case", "vllm", "config", "requests", many)
    obj = _object(data, "", top if kind == "plain" else ("case", "vllm", "kind", "group", *top[2:]))
    name = _typed(obj["case"], "case", str)
    _typed(obj["vllm"], "vllm", str)
    config = _config(obj["config"], kind)
    raw_requests = _typed(obj["requests"], "requests", list)
    if not raw_requests:
        raise _Bad("field 'requests': no requests")
    requests = tuple(_request(r, i, config) for i, r in enumerate(raw_requests))
    arrivals = [r.arrival_step for r in requests]
    if arrivals != sorted(arrivals):
        raise _Bad("field 'requests': not sorted by arrival_step")
    steps = _typed(obj[many], many, list)
    if not steps:
        raise _Bad(f"field '{many}': no {many}")
    case = Case(name, path, line_no, config, requests, tuple(steps), kind)
    if kind == "plain" and not _plain_steps(line):  # besides ints, id strings and the keys
        for k, step in enumerate(steps):
            _step(step, k, len(requests))
    return case


_STEP_KEYS = tuple(f'"{key}"' for key in STEP_FIELDS)
_STEP_CHARS = str.maketrans("", "", '{}[]",:0123456789 ')


def _plain_steps(line: str) -> bool:
    """Whether the text of ``steps`` (the last field) holds only the step keys, brackets,
    digits and quotes. Then every value in it is an int or a string of digits, and a step the
    replay reproduces exactly is in the format: ``check_steps`` is only needed for a case
    that differs (the steps are most of a file, and checking each value costs seconds)."""
    start = line.rfind('"steps":')
    if start < 0:
        return False
    tail = line[start + len('"steps":') : line.rstrip().rfind("}")]
    for key in _STEP_KEYS:
        tail = tail.replace(key, "")
    return not tail.translate(_STEP_CHARS)


def check_steps(case: Case) -> None:
    """Check every recorded step of ``case`` field by field (InputError naming the line)."""
    try:
        for k, step in enumerate(case.steps):
            if case.kind.startswith("async"):
                _call(step, k, len(case.requests))
            else:
                _step(step, k, len(case.requests), case.kind)
    except _Bad as err:
        raise InputError(f"{case.path}:{case.line}: {err}") from None


def _object(value: Any, where: str, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
    label = f"field '{where}'" if where else "the line"
    if not isinstance(value, dict):
        raise _Bad(f"{label}: expected a JSON object, got {type(value).__name__}")
    for key in fields:
        if key not in value:
            raise _Bad(f"field '{where + '.' if where else ''}{key}': missing")
    extra = [k for k in value if k not in fields]
    if extra:
        raise _Bad(f"field '{where + '.' if where else ''}{extra[0]}': unknown field")
    return value


def _typed(value: Any, where: str, kind: type, minimum: int | None = None) -> Any:
    # bool is an int subclass: a true/false count is not in the format
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Bad(f"field '{where}': expected {kind.__name__}, got {json.dumps(value)[:40]}")
    if minimum is not None and cast(int, value) < minimum:
        raise _Bad(f"field '{where}': {value} is below {minimum}")
    return value


def _config(value: Any, case_kind: str) -> dict[str, Any]:
    if case_kind == "mm":
        obj = _object(value, "config", list(CONFIG_FIELDS) + list(MM_CONFIG_FIELDS))
        for key in MM_CONFIG_FIELDS:
            if key == "disable_chunked_mm_input":
                _typed(obj[key], f"config.{key}", bool)
            else:
                _typed(obj[key], f"config.{key}", int, 1)
        return _config({k: obj[k] for k in CONFIG_FIELDS}, "plain") | {
            k: obj[k] for k in MM_CONFIG_FIELDS
        }
    if case_kind in HYBRID_CONFIG_FIELDS:
        return _hybrid_config(value, case_kind)
    extra = list(SPEC_CONFIG_FIELDS) if case_kind != "plain" else []
    obj = _object(value, "config", list(CONFIG_FIELDS) + extra)
    if extra:
        _typed(obj["num_speculative_tokens"], "config.num_speculative_tokens", int, 0)
        _typed(obj["async_scheduling"], "config.async_scheduling", bool)
        if obj["async_scheduling"] != case_kind.startswith("async"):
            raise _Bad(f"field 'config.async_scheduling': does not fit kind {case_kind!r}")
    for key, kind in CONFIG_FIELDS.items():
        if kind is int:
            low = 0 if key == "long_prefill_token_threshold" else 1
            _typed(obj[key], f"config.{key}", kind, low)
        else:
            _typed(obj[key], f"config.{key}", kind)
    if obj["policy"] not in POLICIES:
        raise _Bad(f"field 'config.policy': {obj['policy']!r} is not one of {', '.join(POLICIES)}")
    return dict(obj)


def _hybrid_config(value: Any, case_kind: str) -> dict[str, Any]:
    """A hybrid kind's config: the plain keys, its own, and the groups as vLLM built them."""
    own = (*HYBRID_CONFIG_FIELDS[case_kind], "kind", "kv_groups")
    obj = _object(
        value, "config", [*CONFIG_FIELDS, *own, "scheduler_block_size", "hash_block_size"]
    )
    plain = _config({k: obj[k] for k in CONFIG_FIELDS}, "plain")
    for key in ("scheduler_block_size", "hash_block_size"):
        _typed(obj[key], f"config.{key}", int, 1)
    groups = _typed(obj["kv_groups"], "config.kv_groups", list)
    if not groups:
        raise _Bad("field 'config.kv_groups': no groups")
    for j, g in enumerate(groups):
        where = f"config.kv_groups[{j}]"
        _typed(g, where, dict)
        if g.get("type") not in KV_GROUP_TYPES:
            raise _Bad(
                f"field '{where}.type': {g.get('type')!r} is not one of {', '.join(KV_GROUP_TYPES)}"
            )
        for key in ("layers", "block_size"):
            _typed(g.get(key), f"{where}.{key}", int, 1)
    return {**obj, **plain}


def _request(value: Any, i: int, config: dict[str, Any]) -> Request:
    where = f"requests[{i}]"
    k = config.get("num_speculative_tokens")
    mm = "encoder_cache_size" in config
    extra = ("accept",) if k is not None else ("mm",) if mm else ()
    obj = _object(value, where, (*REQUEST_FIELDS, *extra))
    block_size = config["block_size"]
    if obj["id"] != str(i):
        raise _Bad(f"field '{where}.id': expected {str(i)!r} (the list index), got {obj['id']!r}")
    arrival = _typed(obj["arrival_step"], f"{where}.arrival_step", int, 0)
    prompt = _typed(obj["prompt_len"], f"{where}.prompt_len", int, 1)
    max_tokens = _typed(obj["max_tokens"], f"{where}.max_tokens", int, 1)
    eos_at = obj["eos_at"]
    if eos_at is not None:
        _typed(eos_at, f"{where}.eos_at", int, 0)
        if eos_at >= max_tokens:
            raise _Bad(f"field '{where}.eos_at': {eos_at} is not below max_tokens {max_tokens}")
    priority = _typed(obj["priority"], f"{where}.priority", int)
    hashes = _typed(obj["block_hashes"], f"{where}.block_hashes", list)
    for j, h in enumerate(hashes):
        _typed(h, f"{where}.block_hashes[{j}]", int, 0)
    if len(hashes) != prompt // block_size:
        raise _Bad(
            f"field '{where}.block_hashes': {len(hashes)} entries, expected prompt_len // "
            f"block_size = {prompt // block_size}"
        )
    accept = _typed(obj.get("accept", []), f"{where}.accept", list)
    for j, a in enumerate(accept):
        _typed(a, f"{where}.accept[{j}]", int, 0)
        if a > (k or 0):
            raise _Bad(f"field '{where}.accept[{j}]': {a} is above num_speculative_tokens {k}")
    if k and len(accept) != max_tokens:
        raise _Bad(f"field '{where}.accept': {len(accept)} entries, expected max_tokens")
    items = _items(obj["mm"], where, prompt) if mm else ()
    return Request(
        arrival, prompt, max_tokens, eos_at, priority, tuple(hashes), tuple(accept), items
    )


def _items(value: Any, where: str, prompt_len: int) -> tuple[tuple[int, int, str], ...]:
    """A request's ``mm`` items: placeholder runs in prompt order inside the prompt."""
    items, end = [], 0
    for j, item in enumerate(_typed(value, f"{where}.mm", list)):
        at = f"{where}.mm[{j}]"
        obj = _object(item, at, ("offset", "length", "hash"))
        offset = _typed(obj["offset"], f"{at}.offset", int, end)
        length = _typed(obj["length"], f"{at}.length", int, 1)
        if offset + length > prompt_len:
            raise _Bad(f"field '{at}.length': ends past prompt_len {prompt_len}")
        items.append((offset, length, _typed(obj["hash"], f"{at}.hash", str)))
        end = offset + length
    return tuple(items)


def _call(value: Any, k: int, num_requests: int) -> None:
    """An async engine-loop call: a schedule and an update record, each null or an object."""
    where = f"calls[{k}]"
    obj = _object(value, where, ("schedule", "update"))
    for part in ("schedule", "update"):
        if obj[part] is not None:
            _typed(obj[part], f"{where}.{part}", dict)
            _typed(obj[part].get("batch"), f"{where}.{part}.batch", int, 0)
            _typed(obj[part].get("free_blocks"), f"{where}.{part}.free_blocks", int, 0)


def _step(value: Any, k: int, num_requests: int, kind: str = "plain") -> dict[str, Any]:
    where = f"steps[{k}]"
    fields: tuple[str, ...] = {"plain": STEP_FIELDS, "mm": MM_STEP_FIELDS}.get(
        kind, (*SPEC_STEP_FIELDS, "free_blocks")
    )
    if kind in HYBRID_CONFIG_FIELDS:
        fields = (*STEP_FIELDS, "blocks")
        for rid, held in _typed(
            value.get("blocks") if isinstance(value, dict) else None, f"{where}.blocks", dict
        ).items():
            for j, n in enumerate(_typed(held, f"{where}.blocks.{rid}", list)):
                _typed(n, f"{where}.blocks.{rid}[{j}]", int, 0)
    obj = _object(value, where, fields)
    if kind == "mm":
        _typed(obj["encoder"], f"{where}.encoder", dict)
        _typed(obj["encoder_freed"], f"{where}.encoder_freed", list)
        _typed(obj["encoder_free_slots"], f"{where}.encoder_free_slots", int, 0)
    for part in ("spec", "accepted") if kind == "spec" else ():
        for rid, n in _typed(obj[part], f"{where}.{part}", dict).items():
            _typed(n, f"{where}.{part}.{rid}", int, 0)

    def request_id(v: Any, field: str) -> str:
        _typed(v, field, str)
        if not (v.isdigit() and int(v) < num_requests and str(int(v)) == v):
            raise _Bad(f"field '{field}': {v!r} is not a request id")
        return v

    scheduled = []
    for j, item in enumerate(_typed(obj["scheduled"], f"{where}.scheduled", list)):
        field = f"{where}.scheduled[{j}]"
        if not isinstance(item, list) or len(item) != 2:
            raise _Bad(f"field '{field}': expected [id, tokens]")
        scheduled.append([request_id(item[0], field), _typed(item[1], field, int, 1)])
    cached = _typed(obj["cached"], f"{where}.cached", dict)
    for rid, n in cached.items():
        request_id(rid, f"{where}.cached")
        _typed(n, f"{where}.cached.{rid}", int, 1)
    return {
        "scheduled": scheduled,
        "preempted": [
            request_id(v, f"{where}.preempted")
            for v in _typed(obj["preempted"], f"{where}.preempted", list)
        ],
        "cached": dict(cached),
        "finished": [
            request_id(v, f"{where}.finished")
            for v in _typed(obj["finished"], f"{where}.finished", list)
        ],
        "free_blocks": _typed(obj["free_blocks"], f"{where}.free_blocks", int, 0),
    }
