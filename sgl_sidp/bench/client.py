"""Async streaming HTTP clients for SGLang's native ``/generate`` and the OpenAI ``/v1/completions`` API.

Timing follows ``sglang.bench_serving`` (``async_request_sglang_generate``): the clock starts right before the POST;
TTFT is the time to the first chunk that carries a generated token; a later chunk that brings ``k`` new tokens after
a gap ``g`` adds ``k`` ITL entries of ``g / k``; the latency (E2E) runs to the last non-empty line of the stream
(``data: [DONE]``). One difference, on purpose: a chunk counts as carrying tokens when the server's token count
grows (``meta_info.completion_tokens``, or ``usage.completion_tokens``) rather than when its decoded text is
non-empty, so random-token prompts whose first tokens decode to no text, and servers started with
``--skip-tokenizer-init`` (no text at all), are timed right. Without any token count (a plain OpenAI server),
every chunk with non-empty text counts as one token, as bench_serving's OpenAI client does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import aiohttp
import numpy as np

try:  # bench_serving parses with orjson too: ~2x faster on SGLang's cumulative chunks; it serializes numpy arrays.
    import orjson
except ImportError:  # pragma: no cover - orjson comes with sglang
    orjson = None

BACKENDS = ("sglang", "openai")
ENDPOINTS = {"sglang": "/generate", "openai": "/v1/completions"}
# Same as bench_serving: long streams of cumulative chunks can outgrow aiohttp's 64 KiB default buffer.
READ_BUFSIZE_BYTES = 10 * 1024**2
DEFAULT_REQUEST_TIMEOUT_S = 6 * 60 * 60  # bench_serving's client timeout
# An idle pooled connection is dropped by the client before the server drops it. uvicorn under SGLang closes idle
# keep-alive connections after SGLANG_TIMEOUT_KEEP_ALIVE (5 s); aiohttp's default keeps them 15 s, so a request sent
# after a 5 s gap of the trace could go out on a connection the server was closing ("ServerDisconnectedError: Server
# disconnected", one of 781 requests on vanilla DP2 in q8_shift_3x300s_2gpu_h100).
KEEPALIVE_TIMEOUT_S = 2.0


@dataclass
class RequestOutput:
    """Outcome of one streamed request; the field names and meanings are bench_serving's ``RequestFuncOutput``.

    Attributes:
        success: the stream completed with ``[DONE]`` and no error.
        start_time: ``time.perf_counter()`` right before the request was sent (s).
        ttft: time to first token (s).
        latency: E2E latency: send to the last line of the stream (s).
        itl: inter-token latencies (s), one per generated token after the first chunk.
        output_len: generated tokens received.
        prompt_len: prompt tokens sent.
        cached_tokens: prompt tokens the server served from its prefix cache (``meta_info.cached_tokens``, or
            ``usage.prompt_tokens_details.cached_tokens`` on the OpenAI API); ``None`` when not reported.
        error: why it failed (HTTP status and body, server error chunk, exception).
        dp_rank: the DP replica that served it (SGLang's native ``meta_info.dp_rank``); ``None`` when not
            reported (the OpenAI API, a server without DP, a request that failed first).
    """

    success: bool = False
    start_time: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_len: int = 0
    prompt_len: int = 0
    cached_tokens: int | None = None
    error: str = ""
    dp_rank: int | None = None


def encode_json(obj: Any) -> bytes:
    """Serialize a request body; numpy arrays (prompt ids) become JSON lists."""
    if orjson is not None:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(obj, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else o).encode()


_loads = orjson.loads if orjson is not None else json.loads


def make_payload(
    backend: str,
    input_ids: np.ndarray | list[int],
    output_len: int,
    *,
    temperature: float = 0.0,
    model: str = "default",
    extra: dict | None = None,
) -> bytes:
    """JSON body of a streaming request that forces ``output_len`` generated tokens (``ignore_eos``).

    sglang: ``{"input_ids", "sampling_params": {"temperature", "max_new_tokens", "ignore_eos": true}, "stream"}``.
    openai: ``{"model", "prompt": [ids], "max_tokens", "temperature", "ignore_eos": true, "stream", "stream_options"}``
    (``continuous_usage_stats`` makes SGLang report the token count in every chunk).
    ``extra`` is merged into the top level last.

    Raises:
        ValueError: unknown backend.
    """
    if backend == "sglang":
        body: dict[str, Any] = {
            "input_ids": input_ids,
            "sampling_params": {"temperature": temperature, "max_new_tokens": output_len, "ignore_eos": True},
            "stream": True,
        }
    elif backend == "openai":
        body = {
            "model": model,
            "prompt": input_ids,
            "max_tokens": output_len,
            "temperature": temperature,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    else:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    body.update(extra or {})
    return encode_json(body)


class Chunk(NamedTuple):
    """What one streamed chunk tells: the new token count, cached prompt tokens and serving DP rank if it reports
    them (else None), and an error message if it reports a failure (else "")."""

    count: int
    cached: int | None
    error: str
    dp_rank: int | None = None


# A chunk parser gets the decoded chunk and the token count so far.
ChunkParser = Callable[[dict, int], Chunk]


def _error_of(data: dict) -> str:
    err = data.get("error")
    if err:
        return "server error: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
    return ""


def _parse_sglang_chunk(data: dict, n_tokens: int) -> Chunk:
    if err := _error_of(data):
        return Chunk(n_tokens, None, err)
    meta = data.get("meta_info") or {}
    rank = meta.get("dp_rank")
    rank = None if rank is None else int(rank)
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return Chunk(n_tokens, meta.get("cached_tokens"), f"aborted by server: {finish.get('message', '')}", rank)
    count = meta.get("completion_tokens")
    if count is None:  # not SGLang: one token per chunk with output
        count = n_tokens + 1 if data.get("text") or data.get("output_ids") else n_tokens
    return Chunk(max(int(count), n_tokens), meta.get("cached_tokens"), "", rank)


def _parse_openai_chunk(data: dict, n_tokens: int) -> Chunk:
    if err := _error_of(data):
        return Chunk(n_tokens, None, err)
    usage = data.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if usage.get("completion_tokens") is not None:
        return Chunk(max(int(usage["completion_tokens"]), n_tokens), cached, "")
    choices = data.get("choices") or []
    return Chunk(n_tokens + 1 if choices and choices[0].get("text") else n_tokens, cached, "")


CHUNK_PARSERS: dict[str, ChunkParser] = {"sglang": _parse_sglang_chunk, "openai": _parse_openai_chunk}


def make_session(max_connections: int | None = None) -> aiohttp.ClientSession:
    """One client session for a whole replay: no connection cap unless ``max_connections`` is given, no session
    timeout (each request passes its own), bench_serving's 10 MiB read buffer, idle connections kept
    `KEEPALIVE_TIMEOUT_S` (under the server's)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_connections or 0, keepalive_timeout=KEEPALIVE_TIMEOUT_S),
        timeout=aiohttp.ClientTimeout(total=None),
        read_bufsize=READ_BUFSIZE_BYTES,
    )


async def stream_request(
    session: aiohttp.ClientSession,
    backend: str,
    url: str,
    payload: bytes,
    prompt_len: int,
    timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
) -> RequestOutput:
    """POST one streaming request and time its chunks (see the module docstring).

    Never raises for request failures: HTTP errors, error chunks, server aborts, disconnects (a stream that ends
    without ``[DONE]``) and timeouts come back as ``success=False`` with ``error`` set.

    Args:
        url: full endpoint URL (``base_url + ENDPOINTS[backend]``).
        payload: JSON body from :func:`make_payload`.
        prompt_len: prompt tokens in the payload (recorded, not sent).
        timeout_s: total time limit of the request in seconds (``None``: none).
    """
    parse = CHUNK_PARSERS[backend]
    out = RequestOutput(prompt_len=prompt_len)
    n_tokens = 0
    done = False
    st = time.perf_counter()
    out.start_time = most_recent = st
    try:
        async with session.post(
            url,
            data=payload,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status} {response.reason}: {(await response.text())[:2000]}"
                return out
            async for line in response.content:
                line = line.strip()
                if not line or line.startswith(b":"):  # SSE comment / keep-alive
                    continue
                out.latency = time.perf_counter() - st
                body = line[5:].lstrip() if line.startswith(b"data:") else line
                if body == b"[DONE]":
                    done = True
                    continue
                new_count, cached, error, dp_rank = parse(_loads(body), n_tokens)
                if cached is not None:
                    out.cached_tokens = int(cached)
                if dp_rank is not None:
                    out.dp_rank = dp_rank
                if error:
                    out.error = error
                    return out
                if new_count > n_tokens:
                    now = time.perf_counter()
                    if n_tokens == 0:
                        out.ttft = now - st
                    else:
                        k = new_count - n_tokens
                        out.itl.extend([(now - most_recent) / k] * k)
                    most_recent = now
                    n_tokens = new_count
        out.output_len = n_tokens
        if done:
            out.success = True
        else:
            out.error = "stream ended before data: [DONE] (server disconnected?)"
    except Exception as e:  # noqa: BLE001 - a failed request is data, not a crash
        out.error = f"{type(e).__name__}: {e}" if str(e) else repr(e)
    return out
