"""An asyncio OpenAI-compatible streaming client: /v1/completions with SSE, timed per chunk.

Why our own and not GuideLLM/AIPerf: docs/serving-bench.md (their dependency closures do not fit
the offline GPU machine). What is timed:
  ttft  - request sent -> first chunk with text (the prompt's prefill plus queueing);
  itl   - gaps between consecutive text chunks (a token whose text is empty sends none, so a gap
          may span several tokens: compare text_chunks with output_tokens);
  tpot  - (last chunk - first chunk) / (output tokens - 1): per-token decode time, whatever the chunking.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field

from .http import httpx

from .workload import Request


@dataclass
class Result:
    target_tokens: int
    ttft: float | None = None
    itl: list = field(default_factory=list)
    output_tokens: int = 0  # from the stream's usage chunk (what the server generated)
    text_chunks: int = 0  # chunks that carried text
    retries: int = 0  # connections dropped before any response byte, sent again (see _one)
    prompt_tokens: int | None = None
    latency: float | None = None
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2 or not self.itl:
            return None
        return sum(self.itl) / (self.output_tokens - 1)


# mlx_lm.server is a ThreadingHTTPServer with a listen backlog of 5: under a burst some
# connections are reset before any response byte. Such a request never reached the engine, so it
# is sent again (counted in `retries`, its TTFT still from the first send); a failure after the
# response began is an error.
_MAX_RETRIES = 3


class _Dropped(Exception):
    """The connection failed before the server sent a status line."""


async def _one(client: httpx.AsyncClient, url: str, req: Request, extra: dict) -> Result:
    res = Result(target_tokens=req.max_tokens)
    body = {"prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    t0 = time.perf_counter()
    while True:
        try:
            return await _stream(client, url, body, res, t0)
        except _Dropped as e:
            if res.retries >= _MAX_RETRIES:
                res.error = f"dropped {res.retries + 1} times: {e}"[:200]
                return res
            res.retries += 1
            await asyncio.sleep(0.05 * res.retries)
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            res.error = f"{type(e).__name__}: {e}"[:200]
            return res


async def _stream(client: httpx.AsyncClient, url: str, body: dict, res: Result, t0: float) -> Result:
    answered = False
    try:
        async with client.stream("POST", url, json=body) as r:
            answered = True
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            await _read_events(r, res, t0)
    except (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as e:
        if answered:
            raise
        raise _Dropped(f"{type(e).__name__}: {e}") from e
    res.latency = time.perf_counter() - t0
    if res.output_tokens == 0 and res.error is None:
        res.error = "stream ended without a usage chunk"
    return res


async def _read_events(r: httpx.Response, res: Result, t0: float) -> None:
    last = None
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            res.error = f"stream error: {str(chunk['error'])[:200]}"
            return
        if chunk.get("usage"):
            res.output_tokens = chunk["usage"].get("completion_tokens", 0)
            res.prompt_tokens = chunk["usage"].get("prompt_tokens")
        choices = chunk.get("choices") or []
        if choices and choices[0].get("text"):
            now = time.perf_counter()
            if last is None:
                res.ttft = now - t0
            else:
                res.itl.append(now - last)
            last = now
            res.text_chunks += 1


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Poisson arrivals at `rate` req/s (exponential gaps, seeded); rate inf: all at t=0 (saturation)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def _run(base_url: str, reqs: list[Request], rate: float, concurrency: int | None,
               extra: dict, seed: int, on_done) -> tuple[list[Result], float]:
    url = base_url.rstrip("/") + "/v1/completions"
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        start = time.perf_counter()

        async def fire(at: float, req: Request) -> Result:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            if gate is None:
                res = await _one(client, url, req, extra)
            else:
                async with gate:
                    res = await _one(client, url, req, extra)
            on_done()
            return res

        results = await asyncio.gather(*(fire(at, r) for at, r in zip(arrival_times(len(reqs), rate, seed), reqs)))
        return list(results), time.perf_counter() - start


def run_load(base_url: str, reqs: list[Request], rate: float, concurrency: int | None = None,
             extra: dict | None = None, seed: int = 0, on_done=lambda: None) -> tuple[list[Result], float]:
    """Send `reqs` at `rate` (req/s, inf = all at once), at most `concurrency` in flight when given;
    returns the per-request results and the wall time from the first send to the last answer."""
    return asyncio.run(_run(base_url, reqs, rate, concurrency, extra or {}, seed, on_done))
