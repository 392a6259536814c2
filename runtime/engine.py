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
import logging
import os
import random
import time
from pathlib import Path

import attrs
import mlx.core as mx
import mlx_lm

from graphc.compiler.compile import CompiledGraph, compile_sibling
from graphc.compiler.decode_options import compile_pass, resolve
from graphc.compiler.errors import UnsupportedModel
from graphc.compiler.gguf import resolve_model_path
from graphc.compiler.modelgen import demo_model_path
from graphc.compiler.selfcheck_cache import compile_cached

from . import compiled_decode
from .compiled_decode import CompiledDecode
from .distributed import load_sharded
from .fault import StepGuard
from .grammar import GrammarError, GrammarState
from .kernel_views import KernelViews
from . import kernels
from .kernels import gumbel_choose, top_ranks
from .loop_stream import stream_in_loop
from .oneshot import OneShotRunner, embed, score
from .params import SamplingParams
from .plan_contract import request_problem
from .prefix_cache import for_binding, pool_bytes_per_token
from .host_edits import HostEdits
from .prefix_io import PrefixIO
from .cache.disk_tier import DEFAULT_BLOCK_TOKENS, attach_disk_tier
from .request import GenerationResult, Request, RequestOutput
from .runner import ModelRunner
from .scheduler import STEP_TOKENS, Scheduler
from .speculative import DraftModel, Speculator, parse_speculative, rollback_problem
from .text import TextState, token_bytes_table
from .warmup import warm_up

log = logging.getLogger("graphc.load")


class Engine:
    def __init__(self, model, tokenizer, config: dict, graph=None, *, prefill_chunk: int = 2048,
                 max_batch: int = 64, chain: bool = True, model_path: str | None = None,
                 compile: bool | str | None = None, prefix_cache: bool = True, mem_fraction: float | None = None,
                 max_total_tokens: int | None = None, prefix_interval: int | None = None,
                 seed: int | None = None, kv_budget_tokens: int | None = None, batch_prefill: bool = True,
                 skinny_gemm: bool | None = None, lowering: str = "auto", decode_options: dict | None = None,
                 speculative=None, num_draft_tokens: int | None = None, spec_max_batch: int = 16,
                 spec_max_tokens: int | None = None, draft_model=None, spec_pipeline: bool | None = None,
                 spec_adaptive: bool | None = None, kv_bits: int | None = None,
                 kv_group_size: int | None = None, kv_cache_dir: str | None = None,
                 kv_cache_disk_gb: float | None = None, kv_cache_block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 step_tokens: int | None = STEP_TOKENS):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        # Where the seeds of sampled requests without one come from (add_request): `seed` fixes them.
        self._noise_seeds = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
        self.model_path = model_path
        # lowering: "auto" (fast path where proven by the load-time self-check, else the model's
        # own forward), "fast" or "generic"; see compiler/compile.py and docs/models.md.
        t0 = time.perf_counter()
        self.compiled: CompiledGraph = compile_cached(graph, model, config, lowering=lowering, kv_bits=kv_bits,
                                                      kv_group_size=kv_group_size, model_path=model_path)
        log.info("compiled the step graph (with the load-time self-check unless its verdict was stored): %.1f s",
                 time.perf_counter() - t0)
        if "next_tokens" not in self.compiled.prefill.outputs:
            name = self.compiled.spec.name
            raise ValueError(f"graph '{name}' has no next_tokens output, so it cannot generate; load the model with "
                             f"a generation graph and pass '{name}' to Engine.embed(..., graph=) / "
                             "Engine.score(..., graph=)")
        self._oneshot: dict = {}  # (graph, output) -> OneShotRunner: embed / score graphs, compiled on first use
        # How decode is compiled: the graph's `decode:` section, overridden by compile= /
        # skinny_gemm= / decode_options= when given (compiler/decode_options.py). The decode
        # plan's `compile` pass says what was applied.

        if compile not in (None, True, False, "auto", "measured"):
            raise ValueError(f"compile must be True, False, 'auto' or 'measured', got {compile!r}")
        self.decode_options = resolve(self.compiled.spec.decode_options,
                                      {**(decode_options or {}), "compile": compile, "skinny_matmul": skinny_gemm})
        if self.decode_options["compile"] and self.compiled.binding.lowering != "fast":
            logging.getLogger("graphc.engine").warning(
                "compile applies to the fast path only; model type '%s' runs the generic lowering "
                "uncompiled", self.compiled.binding.model_type)
        elif self.decode_options["compile"]:  # mx.compile the decode forward on fixed-shape KV

            # compile "auto": compiled only where it measured faster than eager (<= AUTO_MAX_BATCH
            # rows, rows x KV capacity <= AUTO_MAX_KV); other steps run eager on the same caches.
            # "measured": every batch-size bucket times both and keeps the faster (measured_gate.py).

            o = self.decode_options
            auto = o["compile"] == "auto"
            self.compiled.decode = CompiledDecode(self.compiled.decode, fuse=o["fuse_projections"],
                                                  kernel=o["attention_kernel"], skinny=o["skinny_matmul"],
                                                  max_batch=compiled_decode.AUTO_MAX_BATCH if auto else None,
                                                  max_kv=compiled_decode.AUTO_MAX_KV if auto else None,
                                                  skinny_table=o["skinny_table"], measured=o["compile"] == "measured",
                                                  kv_write=o["kv_write_kernel"], residual=o["residual_matmul"])
        self._show_compile_pass()
        if not self.compiled.binding.batched:  # exact only one request at a time (compiler/compile.py)
            max_batch, batch_prefill = 1, False
        # Radix prefix cache (runtime/prefix_cache.py) when the graph's policies support it.
        # Pool size: max_total_tokens slots, else mem_fraction of device memory.
        self.prefix = prefix_cache and for_binding(
            self.compiled.binding, mem_fraction=mem_fraction, max_total_tokens=max_total_tokens,
            interval=prefix_interval or min(prefill_chunk, 512)) or None
        io = PrefixIO(self.prefix, self.compiled) if self.prefix is not None else None
        self.disk_tier = attach_disk_tier(self.prefix, io, self.compiled, config, model_path, kv_cache_dir,
                                          kv_cache_disk_gb, kv_cache_block_tokens) if kv_cache_dir else None
        self.vocab_size = self.compiled.vocab_size  # the logits width, as the model computes it
        self.eos_token_ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
        # Grammar masks and logits processors: an object the runner calls, not a closure into the engine.
        self.host_edits = HostEdits(tokenizer, self.vocab_size, self.eos_token_ids)
        self._leaving: list | None = None  # rows ending in the decode step being postprocessed
        self.runner = ModelRunner(self.compiled, chain=chain, host_edits=self.host_edits, prefix_io=io,
                                  vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids,
                                  sampling_kernel=self._sampling_kernel(), host_read=self._host_read())
        # Eager decode steps over left-padded rows and verify forwards take the ragged attention
        # kernel where it serves the layers (CUDA, once it matched MLX here): runtime/kernel_views.py.

        self.runner.views = views = KernelViews(getattr(self.compiled.decode, "step", self.compiled.decode),
                                                enabled=self.decode_options["attention_kernel"])
        if views.on:  # the plan says what runs (graphc inspect)

            d = self.compiled.decode
            d.plan = attrs.evolve(d.plan, passes=d.plan.passes + (("attention kernel", views.pass_line),))
        self.scheduler = Scheduler(max_batch=max_batch, prefill_chunk=prefill_chunk, prefix=self.prefix,
                                   kv_budget=kv_budget_tokens, step_tokens=step_tokens,
                                   batch_prefill=batch_prefill and self.runner.can_batch_prefill)
        self._batch_prefill = batch_prefill
        self.faults = StepGuard(self)  # a failing step ends only the request(s) responsible
        self._token_bytes = token_bytes_table(tokenizer)  # fast detokenization (byte-level BPE)
        self.stats = {"prompt_tokens": 0, "computed_prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0,
                      "preemptions": 0, "step_faults": 0}
        self.speculator = self.runner.speculator = _speculator(self, speculative, num_draft_tokens, spec_max_batch,
                                                               spec_max_tokens, draft_model, spec_pipeline,
                                                               spec_adaptive)

    def _host_read(self) -> str:
        """How the host reads decode tokens (runtime/host_read.py): 8-byte pieces on CUDA when
        `decode: {host_read_pieces: true}`; on CUDA the decode plan says which (graphc inspect)."""
        if not mx.cuda.is_available():
            return "tokens"  # no managed memory: nothing migrates
        how = "pieces" if self.decode_options["host_read_pieces"] else "tokens"

        line = ("8-byte copies of each step's tokens (MLX's scalar pool: no page a step uses migrates to the host)"
                if how == "pieces" else "the step's tokens themselves (decode: {host_read_pieces: true} reads 8-byte copies)")
        d = self.compiled.decode
        d.plan = attrs.evolve(d.plan, passes=d.plan.passes + (("host read", line),))
        return how

    def _sampling_kernel(self) -> bool:
        """Whether fused sampled steps may run their candidate stage (first K ranks, 1/T, noise) in
        the top-ranks kernel, and their top-p scan, filters and Gumbel-max in the Gumbel-choose
        kernel (CUDA, each once it matched MLX here); on CUDA the decode plan says which (graphc
        inspect)."""
        on = bool(self.decode_options["sampling_kernel"])
        if not kernels.available():
            return on  # FusedRows asks the check, which answers "not a CUDA device": MLX's ops run
        off = "off (decode: {sampling_kernel: false})"
        line = f"candidate stage of fused sampled steps: {top_ranks.note() if on else off}"
        if on and top_ranks.check() is None:
            line += f"; their top-p scan, filters and Gumbel-max: {gumbel_choose.note()}"

        d = self.compiled.decode
        d.plan = attrs.evolve(d.plan, passes=d.plan.passes + (("sampling kernel", line),))
        return on

    @property
    def batch_prefill(self) -> bool:
        """Whole short prompts share one left-padded prefill forward (when the graph's caches allow)."""
        return self._batch_prefill

    @batch_prefill.setter
    def batch_prefill(self, on: bool) -> None:
        self._batch_prefill = on
        self.scheduler.batch_prefill = on and self.runner.can_batch_prefill

    def _show_compile_pass(self) -> None:
        """Put what this engine applied to decode into the decode plan's passes (inspect shows them)."""
        d = self.compiled.decode
        applied = d.applied() if hasattr(d, "applied") else None
        line = compile_pass(self.decode_options, self.compiled.binding.lowering, applied)
        passes = tuple(p for p in d.plan.passes if p[0] != "compile") + ((line,) if line else ())
        d.plan = attrs.evolve(d.plan, passes=passes)

    # -- construction -------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path | None = None, graph=None, *, distributed: bool = False,
             **kwargs) -> "Engine":
        """Load a model folder or a .gguf file (the built-in demo model when None) and compile `graph` for it.

        A .gguf file is converted once into a cached mlx-lm folder (graphc.compiler.gguf).
        distributed=True (under `mlx.launch`): shard the model over the world group, tensor
        parallel; rank 0 gets the engine, the other ranks follow it and exit with it
        (runtime/distributed/, docs/distributed.md)."""
        if distributed:
            return load_sharded(model_dir, graph, engine_cls=cls, **kwargs)
        if model_dir is None:
            model_dir = demo_model_path()
        path = resolve_model_path(model_dir)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"no model folder at '{model_dir}' (expected a config.json there); "
                "graphc never downloads weights — build a test model with `graphc make-model`"
            )
        config = json.loads((path / "config.json").read_text())
        t0 = time.perf_counter()
        try:
            model, tokenizer = mlx_lm.load(str(path))
        except Exception as e:  # noqa: BLE001 - whatever mlx-lm (or transformers under it) raises

            raise UnsupportedModel(
                f"model type '{config.get('model_type', '?')}': mlx_lm.load could not load '{path}': "
                f"{type(e).__name__}: {e}. graphc loads models through mlx-lm; fix the folder (config.json, "
                "tokenizer files) so that mlx_lm.load reads it") from e
        log.info("loaded weights and tokenizer from %s: %.1f s", path, time.perf_counter() - t0)
        # model_path is what the user named (a .gguf file stays a .gguf file in names and logs).
        return cls(model, tokenizer, config, graph, model_path=str(model_dir), **kwargs)

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
        self.check_params(params)
        ids = self.encode(prompt)
        budget = self.scheduler.kv_budget
        if budget is not None and len(ids) + self.scheduler.HEADROOM > budget:
            raise ValueError(f"the prompt has {len(ids)} tokens; with {self.scheduler.HEADROOM} tokens of room to "
                             f"generate it does not fit the KV budget of {budget} tokens (kv_budget_tokens)")
        req = Request(ids, params) if request_id is None else Request(ids, params, id=request_id)
        if params.grammar is not None:
            g = params.grammar  # compiled already (AsyncEngine does it off the engine thread) or a spec
            req.grammar = g if isinstance(g, GrammarState) else self.grammar_compiler.compile(g)
        req.detokenizer = TextState(self.tokenizer, params.stop, self._token_bytes)
        # A sampled row without a seed samples as if it had this one: its noise is then a row
        # constant absorbed with the position each step (no per-step key, no fresh words in the
        # step graph), and an Engine seed fixes it.
        req.noise_seed = self._noise_seeds.getrandbits(64)
        self.scheduler.add(req)
        self.stats["prompt_tokens"] += len(ids)
        return req.id

    def check_params(self, params: SamplingParams) -> None:
        """Raise ValueError when the graph cannot serve `params` as asked: an edit kind its
        logit_edits node does not declare, more top logprobs than its max_top_n, logprobs or
        prompt logprobs it does not compute (read from the lowered plan)."""
        problem = request_problem(self.compiled.plan("prefill"), params) or self.speculator.request_problem(params)
        if problem:
            raise ValueError(problem)

    @property
    def grammar_compiler(self):
        """Built on first use; thread-safe (AsyncEngine compiles grammars on worker threads)."""
        return self.host_edits.grammar_compiler

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
        """Run one scheduler iteration: some prefill chunks, then one decode step. Returns deltas.
        If the step raises, only the request(s) responsible end (finish_reason "error"); the
        others are recomputed and go on (runtime/fault.py)."""
        return self.faults.step()

    def _step(self) -> list[RequestOutput]:
        """schedule -> run -> postprocess (nano-vllm's shape), for the step's prefill work and then
        for its decode batch, with plain data between the calls. The decode batch is decided
        after the prefill's postprocess: a request that ends on its first token never decodes,
        and the KV budget sees the rows that just started."""
        sched = self.scheduler.schedule()
        self.faults.begin(sched.prefill)
        touched = self._postprocess_prefill(sched, self.runner.run_prefill(sched.groups))
        batch = self.scheduler.schedule_decode(sched.decode)
        touched += self._postprocess_decode(batch, self.runner.run_decode(batch))
        return [self._delta(r) for r in dict.fromkeys(touched)]

    # -- postprocess: the only writer of output_ids, logprobs, error, first_token_time -------------
    def _postprocess_prefill(self, sched, ran: list) -> list[Request]:
        """Record the prefill's progress with the scheduler and each finished prompt's first token."""
        self.stats["cached_tokens"] += sched.cached_tokens
        touched = []
        for done in ran:
            req = done.req
            self.stats["computed_prompt_tokens"] += done.n
            self.scheduler.advance(req, done.end)
            if done.token is None:
                continue
            req.first_token_time = req.first_token_time or time.perf_counter()
            self.scheduler.started(req)  # it joins the decode batch in run_decode unless it ends here
            if req.params.max_tokens == 0:  # the prompt only (its prompt logprobs, if asked): no token
                self._finish(req, "length")
            else:
                self._append(req, done.token, done.logprobs)
            touched.append(req)
        return touched

    def _postprocess_decode(self, batch, ran: list) -> list[Request]:
        self.stats["preemptions"] += len(batch.preempt)
        touched = []
        # Rows that end this step leave the batch together, after the loop: one runner.leave
        # stores all their KV in the prefix cache in one pool write per layer and drops their
        # rows from the batch caches in one filter per layer. One leave per row cost a store and
        # a filter of every layer per row: when 64 rows ended together, thousands of ops encoded
        # while the rows still decoding waited.
        self._leaving = []
        try:
            for req, tok, lp in ran:
                if req.finished:
                    continue
                self._append(req, tok, lp)
                touched.append(req)
        finally:
            leaving, self._leaving = self._leaving, None
            if leaving:
                self.runner.leave(leaving)
        return touched

    def _append(self, req: Request, tok: int, logprobs: dict | None = None) -> bool:
        """Record one generated token; finish the request if it stops here. True when finished."""
        failed = self.host_edits.take_failure(req)  # its own logits processor failed this step
        if failed is not None:  # drop the token, end it alone
            self.fail(req, failed)
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
            try:
                req.grammar.consume(tok)
            except GrammarError as e:  # e.g. the grammar left no token allowed: fail this request only
                self.fail(req, str(e))
                return True
            hit_stop = hit_stop or req.grammar.done
        if stop_token:
            self._finish(req, "stop")
        elif hit_stop:
            self._finish(req, "stop")
        elif len(req.output_ids) >= p.max_tokens or self.scheduler.at_kv_limit(req):
            self._finish(req, "length")
        return req.finished

    def fail(self, req: Request, why: str) -> None:
        """End `req` alone with finish_reason "error" and `error` saying why (the others go on)."""
        req.error = why
        self._finish(req, "error")

    def _finish(self, req: Request, reason: str) -> None:
        if req.finished:
            return
        self.scheduler.finish(req, reason)  # releases its prefix-cache holds too
        if self._leaving is not None:  # a decode step's postprocess: it leaves with the step's others
            self._leaving.append(req)
        else:
            self.runner.leave([req])  # drops its KV; a decode row stores it in the prefix cache on the way out
        self.host_edits.take_failure(req)

    def _preempt(self, req: Request) -> None:
        """Free a running request's working KV (the budget ran out); it is recomputed later from
        its prompt and output so far — through the prefix cache when there is one — and goes on
        with the same tokens (greedy and seeded rows)."""
        self.scheduler.preempt(req)
        self.runner.leave([req])  # stores its KV in the prefix cache on the way out
        self.stats["preemptions"] += 1

    def cache_stats(self) -> dict:
        """Prefix-cache usage for /metrics: pool slots (free / used), tree tokens and nodes,
        hits and hit tokens, evictions, pool bytes; {"enabled": False} without a prefix cache."""
        if self.prefix is None:
            return {"enabled": False}
        bpt = pool_bytes_per_token(self.compiled.binding.policies)
        return {"enabled": True, **self.prefix.stats(), "pool_bytes": self.runner.prefix_io.nbytes,
                "pool_capacity_bytes": bpt * self.prefix.slots.capacity}

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
        return stream_in_loop(self, prompt, params, request_id)

    def warm_up(self) -> float:
        """Run a short greedy and a short sampled request (batch 1) so that a first real request
        does not pay for kernel builds and the compiled step's trace; `stats` is left as it
        was before. Seconds taken. `graphc serve` calls it before it reports ready
        (runtime/warmup.py)."""
        return warm_up(self)

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
        reqs = {i: self.request(i) for i in ids}
        while self.has_unfinished():
            self.step()
        return [self.result(reqs[i]) for i in ids]

    # -- one-forward graphs: embeddings and scoring ----------------------------------------
    def oneshot(self, graph, output: str):
        """The runner of a graph that runs once per input (graphs/embed.yaml, graphs/score.yaml, or a
        user's), compiled on first use against this engine's model and lowering."""
        key = (str(graph), output)
        if key not in self._oneshot:
            self._oneshot[key] = OneShotRunner(compile_sibling(self.compiled, graph, self.model), output)
        return self._oneshot[key]

    def embed(self, inputs, *, dimensions: int | None = None, graph="embed"):
        """Embeddings of each input (a string or token ids; or a list of them) through `graph`'s
        `embeddings` output. `dimensions` truncates before normalizing (OpenAI's Matryoshka
        semantics). Returns an EmbeddingResult (vectors in input order, prompt token count)."""
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not inputs:
            raise ValueError("input is empty: give at least one string or token list")
        runner = self.oneshot(graph, "embeddings")
        if dimensions is not None:
            width = int(runner.compiled.binding.config.get("hidden_size") or 0)
            if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1 or (
                    width and dimensions > width):
                raise ValueError(f"dimensions must be an integer in 1..{width or 'hidden_size'}, got {dimensions!r}")
            if not any(n.op == "normalize" for n in runner.compiled.spec.nodes):
                raise ValueError(f"graph '{runner.compiled.spec.name}' has no normalize node, which `dimensions` needs")
        return embed(runner, [self.encode(x) for x in inputs], dimensions)

    def score(self, prompt, continuation, *, graph="score"):
        """Logprob of each `continuation` token given `prompt` and the continuation before it, in one
        forward without sampling (evaluation harnesses' loglikelihood). Returns a ScoreResult;
        `score_many` scores several (prompt, continuation) pairs batched."""
        return self.score_many([(prompt, continuation)], graph=graph)[0]

    def score_many(self, pairs, *, graph="score"):
        enc = []
        for prompt, cont in pairs:
            c = self.encode(cont)
            enc.append((self.encode(prompt), c))
        return score(self.oneshot(graph, "scores"), enc)

    # -- read-only views for callers that drive the engine (AsyncEngine, servers) ------------
    def request(self, request_id: str) -> Request | None:
        """The live request with this id (waiting, prefilling or running), or None."""
        return self.scheduler.by_id.get(request_id)

    def load_info(self) -> dict:
        """Queue and memory counters: waiting, running, decode steps run, KV bytes and tokens
        held by running requests, the KV budget (None: unbounded)."""
        sched = self.scheduler
        return {"waiting": len(sched.waiting), "running": len(sched.running), "steps": self.runner.steps,
                "kv_bytes": self.runner.kv_bytes, "kv_tokens": sched.kv_tokens(), "kv_budget": sched.kv_budget,
                # bytes of the decode batch's KV that hold live tokens (runtime/kv_usage.py)
                "kv_live_bytes": self.runner.kv_live_bytes}

    def result(self, req: Request) -> GenerationResult:
        """The GenerationResult of a request (finished or not: what it produced so far)."""
        return GenerationResult(
            request_id=req.id, prompt_ids=req.prompt_ids, token_ids=list(req.output_ids),
            text=req.detokenizer.text, finish_reason=req.finish_reason or "abort",
            cached_tokens=req.cached_tokens, logprobs=req.logprobs or None,
            prompt_logprobs=req.prompt_logprobs,
            ttft_s=(req.first_token_time - req.arrival) if req.first_token_time else None,
            latency_s=(req.finish_time - req.arrival) if req.finish_time else None,
            error=req.error,
        )


def _speculator(engine: Engine, speculative, num_draft_tokens, max_batch: int, max_tokens: int | None = None,
                draft_model=None, pipeline: bool | None = None, adaptive: bool | None = None):
    """The engine's Speculator (runtime/speculative/): speculative decoding for rows that ask, or
    for every plain greedy row when `speculative` sets a default (a draft model makes
    "draft_model" the default). Off for models whose caches cannot roll back (logged when a
    default asked for it)."""
    if draft_model is not None and speculative is None:
        speculative = "draft_model"
    default = parse_speculative(speculative, num_draft_tokens)
    spec = Speculator(engine.compiled.decode, default=None if default == "off" else default, max_batch=max_batch,
                      max_tokens=max_tokens, problem=rollback_problem(engine.compiled.binding), stats=engine.stats,
                      pipeline=pipeline, adaptive=adaptive, views=engine.runner.views)
    spec.eos_token_ids = set(engine.eos_token_ids)
    if default not in (None, "off") and spec.problem:
        logging.getLogger("graphc.engine").warning("speculative=%r is off for this model: %s", speculative,
                                                   spec.problem)
    if draft_model is not None:
        if not isinstance(draft_model, DraftModel):  # a folder or .gguf path
            draft_model = DraftModel.load(draft_model, engine.tokenizer, engine.vocab_size)
        spec.draft_model = draft_model
    return spec
