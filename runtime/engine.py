"""The Engine: load a model, compile its step graph, run requests with continuous batching.

    from graphc.runtime import Engine, SamplingParams
    engine = Engine.load("path/to/model")          # graph picked from the layer types
    [res] = engine.generate(["Once upon a time"], SamplingParams(max_tokens=32))
    print(res.text)

Low-level loop for servers: `add_request`, `step`, `abort`; `stream` for asyncio; AsyncEngine
runs it on its own thread (see docs/embedding.md).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from graphc.compiler.compile import CompiledGraph, compile_graph

from .params import SamplingParams
from .prefix_cache import for_binding
from .prefix_io import PrefixIO
from .request import GenerationResult, Request, RequestOutput, Status
from .runner import ModelRunner
from .scheduler import Scheduler
from .text import TextState, token_bytes_table


def _padded_ok(lengths: list[int], chunk: int) -> bool:
    """A batched prefill pads every prompt to the longest: allow it while the padded batch is no
    bigger than one prefill chunk, or the padding stays under a third of the work."""
    padded = max(lengths) * len(lengths)
    return padded <= chunk or padded <= 1.5 * sum(lengths)


def _guarded(req: Request):
    """The request's Python logits processors as one callable that cannot fail the batch: an
    exception marks this request failed (it ends with finish_reason "error") and leaves its
    logits as they were; the other rows go on."""
    procs = req.params.logits_processors
    if not procs:
        return None

    def run(ids, logits):
        try:
            out = logits
            for proc in procs:
                out = proc(ids, out)
            return out
        except Exception as e:  # noqa: BLE001 - user code: any failure is this request's own
            req.error = f"logits processor failed: {type(e).__name__}: {e}"
            return logits

    return (run,)


class Engine:
    def __init__(self, model, tokenizer, config: dict, graph=None, *, prefill_chunk: int = 2048,
                 max_batch: int = 64, chain: bool = True, model_path: str | None = None,
                 compile: bool | str = False, prefix_cache: bool = True, mem_fraction: float | None = None,
                 max_total_tokens: int | None = None, prefix_interval: int | None = None,
                 seed: int | None = None, kv_budget_tokens: int | None = None, batch_prefill: bool = True,
                 skinny_gemm: bool | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.model_path = model_path
        self.compiled: CompiledGraph = compile_graph(graph, model, config)
        if compile not in (True, False, "auto"):
            raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
        if compile:  # mx.compile the decode forward on fixed-shape KV (runtime/compiled_decode.py)
            from .compiled_decode import AUTO_MAX_BATCH, CompiledDecode

            # skinny_gemm: the CUDA small-batch matmul kernel (runtime/kernels/skinny_matmul.py);
            # None reads GRAPHC_SKINNY_GEMM (off unless "1").
            # "auto": compiled only for batches where it measured faster than eager (<= AUTO_MAX_BATCH).
            self.compiled.decode = CompiledDecode(self.compiled.decode, skinny=skinny_gemm,
                                                  max_batch=AUTO_MAX_BATCH if compile == "auto" else None)
        # Radix prefix cache (runtime/prefix_cache.py) when the graph's policies support it.
        # Pool size: max_total_tokens slots, else mem_fraction of device memory.
        self.prefix = prefix_cache and for_binding(
            self.compiled.binding, mem_fraction=mem_fraction, max_total_tokens=max_total_tokens,
            interval=prefix_interval or min(prefill_chunk, 512)) or None
        io = PrefixIO(self.prefix, self.compiled) if self.prefix is not None else None
        self.vocab_size = int(config.get("vocab_size") or model.args.vocab_size)
        self.eos_token_ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
        self.runner = ModelRunner(self.compiled, chain=chain, host_edits=self._host_edits, prefix_io=io,
                                  vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids, seed=seed)
        self.scheduler = Scheduler(max_batch=max_batch, prefill_chunk=prefill_chunk,
                                   admit=self._admit if self.prefix is not None else None,
                                   defer=self.prefix.should_wait if self.prefix is not None else None,
                                   kv_budget=kv_budget_tokens)
        self.batch_prefill = batch_prefill  # whole short prompts share one prefill forward
        self._grammar = None  # GrammarCompiler, built on the first request that needs one
        self._grammar_lock = threading.Lock()
        self._token_bytes = token_bytes_table(tokenizer)  # fast detokenization (byte-level BPE)
        self.stats = {"prompt_tokens": 0, "computed_prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0,
                      "preemptions": 0}

    # -- construction -------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path | None = None, graph=None, **kwargs) -> "Engine":
        """Load a model folder (the built-in demo model when None) and compile `graph` for it."""
        import mlx_lm

        if model_dir is None:
            from graphc.compiler.modelgen import demo_model_path

            model_dir = demo_model_path()
        path = Path(model_dir)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"no model folder at '{model_dir}' (expected a config.json there); "
                "graphc never downloads weights — build a test model with `graphc make-model`"
            )
        config = json.loads((path / "config.json").read_text())
        model, tokenizer = mlx_lm.load(str(path))
        return cls(model, tokenizer, config, graph, model_path=str(path), **kwargs)

    # -- low-level loop -------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is out of range for a vocabulary of {self.vocab_size}")
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        return ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request; returns its id. Raises ValueError for a bad prompt or params."""
        params = (params or SamplingParams()).validate(self.vocab_size)
        ids = self.encode(prompt)
        budget = self.scheduler.kv_budget
        if budget is not None and len(ids) + self.scheduler.HEADROOM > budget:
            raise ValueError(f"the prompt has {len(ids)} tokens; with {self.scheduler.HEADROOM} tokens of room to "
                             f"generate it does not fit the KV budget of {budget} tokens (kv_budget_tokens)")
        req = Request(ids, params) if request_id is None else Request(ids, params, id=request_id)
        if params.grammar is not None:
            from .grammar import GrammarState

            g = params.grammar  # compiled already (AsyncEngine does it off the engine thread) or a spec
            req.grammar = g if isinstance(g, GrammarState) else self.grammar_compiler.compile(g)
        req.detokenizer = TextState(self.tokenizer, params.stop, self._token_bytes)
        self.scheduler.add(req)
        self.stats["prompt_tokens"] += len(ids)
        return req.id

    @property
    def grammar_compiler(self):
        """Built on first use; thread-safe (AsyncEngine compiles grammars on worker threads)."""
        with self._grammar_lock:
            if self._grammar is None:
                from .grammar import GrammarCompiler

                self._grammar = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._grammar

    def _host_edits(self, rows: list[Request], logits):
        """Additive [B, V] edits for rows that need the host: grammar masks and Python logits processors."""
        import mlx.core as mx

        from .grammar.matcher import bitmask_to_additive

        edits = None
        if any(r.grammar is not None for r in rows):
            # Runs on the CPU while the device computes `logits` (queued by the runner).
            words = self.grammar_compiler.fill_masks([r.grammar for r in rows])
            edits = bitmask_to_additive(words, self.vocab_size)
        if any(r.params.logits_processors for r in rows):
            from .sampling import apply_logits_processors

            # mlx-lm's convention: proc(token ids so far [n], logits [1, V]) -> [1, V].
            base = logits if edits is None else logits + edits
            new = apply_logits_processors(base, [_guarded(r) for r in rows],
                                          [r.prompt_ids + r.output_ids for r in rows])
            delta = new - base
            delta = mx.where(mx.isnan(delta), 0.0, delta)  # -inf already in base (a grammar mask) stays
            edits = delta if edits is None else edits + delta
        return edits

    def abort(self, request_id: str) -> bool:
        """Stop a request now; it reports finish_reason 'abort'. False if it is unknown or done."""
        req = self.scheduler.by_id.get(request_id)
        if req is None:
            return False
        self._finish(req, "abort")
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """Run one scheduler iteration: some prefill chunks, then one decode step. Returns deltas."""
        sched = self.scheduler.schedule()
        touched: list[Request] = []
        for group in self._prefill_groups(sched.prefill):
            if len(group) > 1:  # whole prompts, one left-padded forward
                firsts = self.runner.prefill_batch([r for r, _ in group])
                keep = []
                for (req, n), (tok, lp) in zip(group, firsts):
                    self.stats["computed_prompt_tokens"] += n
                    req.first_token_time = req.first_token_time or time.perf_counter()
                    self.scheduler.started(req)
                    if not self._append(req, tok, lp):
                        keep.append(req)
                    touched.append(req)
                self.runner.join_prefilled(keep)
                continue
            [(req, n)] = group
            if req.status is Status.WAITING:
                req.status = Status.PREFILLING
            first = self.runner.prefill_chunk(req, n)
            self.stats["computed_prompt_tokens"] += n
            if first is None:
                continue
            req.first_token_time = req.first_token_time or time.perf_counter()
            self.scheduler.started(req)
            if not self._append(req, first, req.pending_logprobs):
                self.runner.join(req)
            touched.append(req)
        for req in self.scheduler.over_budget():
            self._preempt(req)
        if self.scheduler.running and sched.decode:
            for req, tok, lp in self.runner.decode():
                if req.finished:
                    continue
                self._append(req, tok, lp)
                touched.append(req)
        return [self._delta(r) for r in dict.fromkeys(touched)]

    def _prefill_groups(self, chunks: list) -> list[list]:
        """Consecutive chunks that are whole prompts with nothing cached go through one batched
        forward (when the graph's caches allow it); every other chunk runs alone."""
        batchable = self.batch_prefill and self.runner.can_batch_prefill
        groups: list[list] = []
        for req, n in chunks:
            whole = (batchable and req.prefilled == 0 and n == len(req.context_ids)
                     and req.params.prompt_logprobs is None)
            g = groups[-1] if groups else None
            if whole and g and g[-1][2] and _padded_ok([m for _, m, _ in g] + [n], self.scheduler.prefill_chunk):
                g.append((req, n, True))
            else:
                groups.append([(req, n, whole)])
        return [[(r, n) for r, n, _ in g] for g in groups]

    def _append(self, req: Request, tok: int, logprobs: dict | None = None) -> bool:
        """Record one generated token; finish the request if it stops here. True when finished."""
        if req.error is not None:  # its own code failed this step: drop the token, end it alone
            self._finish(req, "error")
            return True
        req.output_ids.append(tok)
        if logprobs is not None:
            req.logprobs.append(logprobs)
        self.stats["generated_tokens"] += 1
        p = req.params
        stop_token = (tok in self.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids
        # A stop token ends the text; it is in token_ids but not in the text (like OpenAI's API).
        hit_stop = not stop_token and req.detokenizer.add(tok)
        if req.grammar is not None and tok not in self.eos_token_ids:
            from .grammar import GrammarError

            try:
                req.grammar.consume(tok)
            except GrammarError as e:  # e.g. the grammar left no token allowed: fail this request only
                req.error = str(e)
                self._finish(req, "error")
                return True
            hit_stop = hit_stop or req.grammar.done
        if stop_token:
            self._finish(req, "stop")
        elif hit_stop:
            self._finish(req, "stop")
        elif len(req.output_ids) >= p.max_tokens:
            self._finish(req, "length")
        return req.finished

    def _finish(self, req: Request, reason: str) -> None:
        if req.finished:
            return
        req.finish_time = time.perf_counter()
        was_running = req.status is Status.RUNNING
        self.scheduler.finish(req, reason)
        req.caches = None  # a request aborted mid-prefill drops its partial KV
        if was_running:
            self.runner.leave([req])  # stores its KV in the prefix cache on the way out
        if self.prefix is not None:
            self.prefix.release(req)  # every tree reference and pin it held

    def _preempt(self, req: Request) -> None:
        """Free a running request's working KV (the budget ran out); it is recomputed later from
        its prompt and output so far — through the prefix cache when there is one — and goes on
        with the same tokens (greedy and seeded rows)."""
        self.runner.leave([req])  # stores its KV in the prefix cache on the way out
        if self.prefix is not None:
            self.prefix.release(req)
        self.scheduler.preempted(req)
        self.stats["preemptions"] += 1

    def _admit(self, req: Request) -> None:
        self.stats["cached_tokens"] += self.prefix.admit(req)

    def cache_stats(self) -> dict:
        """Prefix-cache usage for /metrics: pool slots (free / used), tree tokens and nodes,
        hits and hit tokens, evictions, pool bytes; {"enabled": False} without a prefix cache."""
        if self.prefix is None:
            return {"enabled": False}
        return {"enabled": True, **self.prefix.stats(), "pool_bytes": self.runner.prefix_io.nbytes}

    def _delta(self, req: Request) -> RequestOutput:
        new_ids = req.output_ids[req.emitted_tokens:]
        req.emitted_tokens = len(req.output_ids)
        text = req.detokenizer.flush() if req.finished else req.detokenizer.ready()
        new_lps = req.logprobs[req.emitted_logprobs:] if req.logprobs else None
        req.emitted_logprobs = len(req.logprobs)
        return RequestOutput(req.id, new_ids, text, req.finished, req.finish_reason, new_lps or None)

    # -- one-call API ---------------------------------------------------------------
    def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
               request_id: str | None = None):
        """Async iterator of one request's deltas (RequestOutput), stepping this engine on the
        caller's event loop; leaving early aborts it. Servers use AsyncEngine (own thread)."""
        from .loop_stream import stream_in_loop

        return stream_in_loop(self, prompt, params, request_id)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 progress: bool = False) -> list[GenerationResult]:
        """Run every prompt to completion, batched together; one result per prompt, in order."""
        if isinstance(prompts, (str,)) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate() takes a list of prompts (strings or token-id lists)")
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        else:
            params = [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        reqs = {i: self.scheduler.by_id[i] for i in ids}
        while self.has_unfinished():
            self.step()
        return [self._result(reqs[i]) for i in ids]

    def _result(self, req: Request) -> GenerationResult:
        return GenerationResult(
            request_id=req.id, prompt_ids=req.prompt_ids, token_ids=list(req.output_ids),
            text=req.detokenizer.text, finish_reason=req.finish_reason or "abort",
            cached_tokens=req.cached_tokens, logprobs=req.logprobs or None,
            prompt_logprobs=req.prompt_logprobs,
            ttft_s=(req.first_token_time - req.arrival) if req.first_token_time else None,
            latency_s=(req.finish_time - req.arrival) if req.finish_time else None,
            error=req.error,
        )
