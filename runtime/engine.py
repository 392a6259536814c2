"""The Engine: load a model, compile its step graph, run requests with continuous batching.

    from graphc.runtime import Engine, SamplingParams
    engine = Engine.load("path/to/model")          # graph picked from the layer types
    [res] = engine.generate(["Once upon a time"], SamplingParams(max_tokens=32))
    print(res.text)

Low-level loop for servers: `add_request`, `step`, `abort`; `stream` for asyncio; AsyncEngine
runs it on its own thread (see docs/embedding.md).
"""

from __future__ import annotations

import collections
import logging
import os
import random
import time
from pathlib import Path

from graphc.compiler.compile import CompiledGraph, declares_quantized
from graphc.compiler.selfcheck_cache import compile_cached

from .compiled_decode import build_decode_step
from .config import EngineConfig
from .engine_faults import FaultRecovery
from .engine_oneshot import OneShotGraphs
from .engine_speculator import speculator_for
from .engine_views import EngineViews
from .engine_warmup import EngineWarmUp
from .fault import StepGuard
from .grammar import GrammarError, GrammarState
from .kernel_views import KernelViews
from .loop_stream import stream_in_loop
from .params import SamplingParams
from .plan_contract import request_problem
from .prefix_sizing import for_binding
from .host_edits import HostEdits
from .prefix_io import PrefixIO
from .prefill_rate import PrefillRate
from .cache.disk_tier import attach_disk_tier
from .cpu_weights import WeightsChoice
from .engine_load import load_engine
from .request import GenerationResult, Request, RequestOutput
from .runner import ModelRunner
from .scheduler import Scheduler, burst_sizes, step_tokens_floor
from .target import probe_target, requested_of
from .text import TextState, token_bytes_table

log = logging.getLogger("graphc.load")


class Engine(OneShotGraphs, EngineViews, FaultRecovery, EngineWarmUp):
    def __init__(self, model, tokenizer, config: dict, graph=None, *, engine_config: EngineConfig | None = None,
                 **options):
        """`options` are EngineConfig's fields as keywords (runtime/config.py), applied over
        `engine_config` (or the defaults); an unknown one is a TypeError naming it."""
        c = self.engine_config = EngineConfig.from_kwargs(engine_config, **options)
        prefill_chunk, max_batch, batch_prefill = c.prefill_chunk, c.max_batch, c.batch_prefill
        self.model = model
        # what Engine.load did to the weights (runtime/cpu_weights.py); replaced by Engine.load where it converts
        self.weights = WeightsChoice("stored", "not converted: a model handed to Engine(), or sharded by a distributed load")
        self.tokenizer = tokenizer
        self.config = config
        # Where the seeds of sampled requests without one come from (add_request): `seed` fixes them.
        self._noise_seeds = random.Random(c.seed if c.seed is not None else int.from_bytes(os.urandom(8), "little"))
        self.model_path = c.model_path
        # lowering: "auto" (fast path where proven by the load-time self-check, else the model's
        # own forward), "fast" or "generic"; see compiler/compile.py and docs/models.md. How decode
        # runs (compile mode, attention, sampling, speculative arms) is chosen by the compiler's
        # choice passes from the graph's `decode:` section under this config's overrides and the
        # device's facts (runtime/target.py); the runtime below only obeys the plan's choices.
        t0 = time.perf_counter()
        target = probe_target(quantized=c.kv_bits is not None or declares_quantized(graph, config))
        compiled = compile_cached(graph, model, config, lowering=c.lowering, kv_bits=c.kv_bits,
                                  kv_group_size=c.kv_group_size, target=target, requested=requested_of(c),
                                  model_path=c.model_path, adapter_path=c.adapter_path)
        log.info("compiled the step graph (with the load-time self-check unless its verdict was stored): %.1f s",
                 time.perf_counter() - t0)
        if "next_tokens" not in compiled.prefill.outputs:
            name = compiled.spec.name
            raise ValueError(f"graph '{name}' has no next_tokens output, so it cannot generate; load the model with "
                             f"a generation graph and pass '{name}' to Engine.embed(..., graph=) / "
                             "Engine.score(..., graph=)")
        self._oneshot: dict = {}  # (graph, output) -> OneShotRunner: embed / score graphs, compiled on first use
        plan = compiled.decode.plan
        self.decode_options = dict(plan.decode_options)
        if self.decode_options["compile"] and compiled.binding.lowering != "fast":
            logging.getLogger("graphc.engine").warning(
                "compile applies to the fast path only; model type '%s' runs the generic lowering "
                "uncompiled", compiled.binding.model_type)
        # The decode step the plan's compile mode names (runtime/compiled_decode.py): a new
        # CompiledGraph carrying it, the compiler's plans unchanged.
        self.compiled: CompiledGraph = compiled.with_decode(build_decode_step(compiled.decode))
        if not self.compiled.binding.batched:  # exact only one request at a time (compiler/compile.py)
            max_batch, batch_prefill = 1, False
        # Radix prefix cache (runtime/prefix_cache.py) when the graph's policies support it.
        # Pool size: max_total_tokens slots, else mem_fraction of device memory.
        self.prefix = c.prefix_cache and for_binding(
            self.compiled.binding, mem_fraction=c.mem_fraction, max_total_tokens=c.max_total_tokens,
            interval=c.prefix_interval or min(prefill_chunk, 512), snapshot_interval=c.snapshot_interval) or None
        io = PrefixIO(self.prefix, self.compiled) if self.prefix is not None else None
        # Prompt tokens per second of the prefill forwards the runner runs (runtime/prefill_rate.py):
        # the runner feeds it, the disk tier weighs reading a hit against it; made here, handed to both.
        self.prefill_rate = PrefillRate()
        self.disk_tier = attach_disk_tier(self.prefix, io, self.compiled, config, c.model_path, c.kv_cache_dir,
                                          c.kv_cache_disk_gb, c.kv_cache_block_tokens, read=c.kv_cache_disk_read,
                                          prefill_rate=self.prefill_rate,
                                          adapter_path=c.adapter_path) if c.kv_cache_dir else None
        self.vocab_size = self.compiled.vocab_size  # the logits width, as the model computes it
        self.eos_token_ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
        # Grammar masks and logits processors: an object the runner calls, not a closure into the engine.
        self.host_edits = HostEdits(tokenizer, self.vocab_size, self.eos_token_ids)
        self.stats = {"prompt_tokens": 0, "computed_prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0,
                      "preemptions": 0, "step_faults": 0}
        # Eager decode steps over left-padded rows and verify forwards take the ragged attention
        # kernel where the plan chose it (runtime/kernel_views.py). The views and the speculator
        # are built before the runner and handed to it: no component is assigned into afterwards.
        views = KernelViews(compiled.decode)
        self.speculator = speculator_for(c, self.compiled, views=views, stats=self.stats,
                                         eos_token_ids=self.eos_token_ids, tokenizer=tokenizer,
                                         vocab_size=self.vocab_size)
        self.runner = ModelRunner(self.compiled, chain=c.chain, host_edits=self.host_edits, prefix_io=io,
                                  views=views, speculator=self.speculator, prefill_rate=self.prefill_rate,
                                  vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids,
                                  sampling_kernel=plan.choice("sampling").choice == "fused cuda",
                                  host_read=plan.choice("host read").choice)
        if c.pad_final_chunk is True and self.runner.final_chunk.off:  # asked, refused by the prefill pass
            log.info("pad_final_chunk: final prefill chunks stay unpadded: %s", self.runner.final_chunk.off)
        self.scheduler = Scheduler(max_batch=max_batch, prefill_chunk=prefill_chunk, prefix=self.prefix,
                                   kv_budget=c.kv_budget_tokens, step_tokens=c.step_tokens,
                                   step_tokens_floor=step_tokens_floor(target.device), burst=burst_sizes(target.device),
                                   batch_prefill=batch_prefill and self.runner.can_batch_prefill,
                                   lanes=self.runner.batched.lanes, hit_align=self.runner.final_chunk.align)
        self._batch_prefill = batch_prefill
        self.faults = StepGuard()  # who takes part in each step; a failing one ends only the request(s) responsible
        self.warmed_on_thread: int | None = None  # warm_up()'s thread: MLX's CUDA plans are per thread
        # shapes the warm-up's time caps left (runtime/warmup_plans.py), built by warm_idle()
        self.idle_warm: collections.deque = collections.deque()
        self._idle_warmed = [0, 0.0]  # shapes warm_idle() built, and their seconds
        self._idle_logged = False  # the first drain's line is INFO; a next turn's later drains DEBUG
        # lists a next turn's prompt-chunk shapes on idle_warm when a request ends (set by the warm-up)
        self.continuation = None
        self._token_bytes = token_bytes_table(tokenizer)  # fast detokenization (byte-level BPE)

    @property
    def batch_prefill(self) -> bool:
        """Whole short prompts may share one left-padded prefill forward: EngineConfig's batch_prefill,
        off for a graph exact only one request at a time; fixed at construction. The scheduler takes
        it where the graph's caches allow it too (ModelRunner.can_batch_prefill)."""
        return self._batch_prefill

    # -- construction -------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path | None = None, graph=None, *, distributed: bool = False,
             cpu_weights: str | None = None, **kwargs) -> "Engine":
        """Load a model folder or a .gguf file (the built-in demo model when None) and compile `graph` for it.

        A .gguf file is converted once into a cached mlx-lm folder (graphc.compiler.gguf).
        distributed=True (under `mlx.launch`): shard the model over the world group, tensor
        parallel; rank 0 gets the engine, the other ranks follow it and exit with it
        (runtime/distributed/, docs/distributed.md).
        cpu_weights: "auto" (the default, also for None), "stored" or "float32": on the CPU
        the model computes in float32, quantized layers dequantized where they fit
        (runtime/cpu_weights.py; `engine.weights` says what was done)."""
        return load_engine(cls, model_dir, graph, distributed=distributed, cpu_weights=cpu_weights, **kwargs)

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
        others are recomputed and go on (runtime/fault.py decides, runtime/engine_faults.py applies)."""
        self.faults.start()
        try:
            outs = self._step()
        except Exception as exc:  # noqa: BLE001 - any failure inside the step is isolated by the guard
            return self._recover(exc)
        self.faults.passed()
        return outs

    def _step(self) -> list[RequestOutput]:
        """schedule -> run -> postprocess (nano-vllm's shape), for the step's prefill work and then
        for its decode batch, with plain data between the calls. The decode batch is decided
        after the prefill's postprocess: a request that ends on its first token never decodes,
        and the KV budget sees the rows that just started."""
        sched = self.scheduler.schedule()
        self.faults.begin(sched.prefill, self.scheduler.running + self.scheduler.in_flight())
        touched = self._postprocess_prefill(sched, self.runner.run_prefill(sched.groups))
        batch = self.scheduler.schedule_decode(sched.decode)
        touched += self._postprocess_decode(batch, self.runner.run_decode(batch))
        # Prompt chunks riding decode launches (runtime/mixed_step.py): launched, or read with their launch.
        touched += self._postprocess_prefill(None, self.runner.take_late())
        return [self._delta(r) for r in dict.fromkeys(touched)]

    # -- postprocess: the only writer of output_ids, logprobs, error, first_token_time -------------
    def _postprocess_prefill(self, sched, ran: list) -> list[Request]:
        """Record the prefill's progress with the scheduler and each finished prompt's first token."""
        if sched is not None:
            self.stats["cached_tokens"] += sched.cached_tokens
        touched, ended = [], []
        try:
            for done in ran:
                req = done.req
                self.stats["computed_prompt_tokens"] += done.n
                self.scheduler.advance(req, done.end)
                if done.token is None:
                    continue
                req.first_token_time = req.first_token_time or time.perf_counter()
                self.scheduler.started(req)  # it joins the decode batch in run_decode unless it ends here
                if req.params.max_tokens == 0:  # the prompt only (its prompt logprobs, if asked): no token
                    self._stop(req, "length")
                else:
                    self._append(req, done.token, done.logprobs)
                touched.append(req)
                if req.finished:
                    ended.append(req)
        finally:
            if ended:
                self.runner.leave(ended)
        return touched

    def _postprocess_decode(self, batch, ran: list) -> list[Request]:
        self.stats["preemptions"] += len(batch.preempt)
        touched = []
        # Rows that end this step leave the batch together, after the loop: one runner.leave
        # stores all their KV in the prefix cache in one pool write per layer and drops their
        # rows from the batch caches in one filter per layer. One leave per row cost a store and
        # a filter of every layer per row: when 64 rows ended together, thousands of ops encoded
        # while the rows still decoding waited.
        ended = []
        try:
            for req, tok, lp in ran:
                if req.finished:
                    continue
                if self._append(req, tok, lp):
                    ended.append(req)
                touched.append(req)
        finally:
            if ended:
                self.runner.leave(ended)
        return touched

    def _append(self, req: Request, tok: int, logprobs: dict | None = None) -> bool:
        """Record one generated token; end the request if it stops here. True when it ended: the
        caller hands its row to the runner (`runner.leave`), with the other rows its step ended."""
        failed = self.host_edits.take_failure(req)  # its own logits processor failed this step
        if failed is not None:  # drop the token, end it alone
            req.error = failed
            return self._stop(req, "error")
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
                req.error = str(e)
                return self._stop(req, "error")
            hit_stop = hit_stop or req.grammar.done
        if stop_token:
            self._stop(req, "stop")
        elif hit_stop:
            self._stop(req, "stop")
        elif len(req.output_ids) >= p.max_tokens or self.scheduler.at_kv_limit(req):
            self._stop(req, "length")
        return req.finished

    def fail(self, req: Request, why: str) -> None:
        """End `req` alone with finish_reason "error" and `error` saying why (the others go on)."""
        req.error = why
        self._finish(req, "error")

    def _finish(self, req: Request, reason: str) -> None:
        """End `req` outside a step's postprocess (abort, a fault's culprit): its row leaves now."""
        if self._stop(req, reason):
            self.runner.leave([req])  # drops its KV; a decode row stores it in the prefix cache on the way out

    def _stop(self, req: Request, reason: str) -> bool:
        """The scheduler's side of ending `req`; True when it ended now (it was not finished).
        Its row is left to the caller: a step's postprocess hands every row the step ended to
        the runner in one `leave` (one pool write and one filter per layer for all of them)."""
        if req.finished:
            return False
        self.scheduler.finish(req, reason)  # releases its prefix-cache holds too
        self.host_edits.take_failure(req)
        if self.continuation is not None:  # its conversation's next turn, built while idle
            self.continuation.ended(req)
        return True

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
