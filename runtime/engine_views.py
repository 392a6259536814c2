"""Read-only views of an Engine for the callers that drive it (AsyncEngine, servers, /metrics).

A mixin of Engine: each reads the scheduler, runner, prefix cache or plans and writes nothing,
so a caller learns what the engine holds and how its step runs without reaching into them.
"""

from __future__ import annotations

from .prefix_sizing import pool_bytes_per_token
from .request import GenerationResult, Request


class EngineViews:
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
                "kv_live_bytes": self.runner.kv_live_bytes,
                # prompt chunks that rode a decode step's forward (mixed steps, runtime/mixed_step.py)
                "fused_chunks": self.runner.mixed.steps if self.runner.mixed is not None else 0}

    def describe(self) -> dict:
        """How this engine's decode step runs: the decode plan's choices ({name, choice,
        alternatives, why, arms}: compiler/passes/), and for each measured choice the arm its gate
        runs now (`in_use`: the latest (arm, batch bucket) and the arm per bucket) with the rates it
        measured; `built`: what the compiled step built as the plan chose (fused blocks' memory).
        Plain data: `json.dumps(engine.describe())`; docs/inspect.md."""
        plan = self.compiled.plan("decode")
        gates = {"compile mode": getattr(self.compiled.decode, "gate", None), "speculative arm": self.speculator.gate}
        choices = []
        for c in plan.choices:
            d = c.to_dict()
            gate = gates.get(c.name) if c.measured else None
            if gate is not None:
                d["in_use"] = gate.in_use()
                d["rates"] = {str(b): r for b, r in gate.rates().items()}
            choices.append(d)
        applied = getattr(self.compiled.decode, "applied", None)
        s = self.scheduler
        return {"graph": plan.graph, "model_type": plan.model_type, "lowering": plan.lowering, "target": plan.target,
                "choices": choices, "built": applied() if applied is not None else None,
                # what the load did to the weights (runtime/cpu_weights.py): float32 on the CPU, or as stored
                "weights": self.weights.to_dict(),
                # how prompts are admitted (docs/scheduling.md): the device's burst, the step budget, the lanes
                "scheduling": {"max_batch": s.max_batch, "prefill_chunk": s.prefill_chunk, "step_tokens": s.step_tokens,
                               "step_tokens_floor": s.step_tokens_floor, "burst_tokens": s.BURST_TOKENS,
                               "burst_step_tokens": s.BURST_STEP_TOKENS, "prefill_lanes": s.lanes,
                               "prefix_hit_align": s.hit_align,
                               # prompt chunks that rode a decode launch so far (runtime/mixed_step.py); None: off
                               "mixed_steps": self.runner.mixed.steps if self.runner.mixed is not None else None},
                # the prefix cache's disk tier: its folder, block size, read policy and the two rates it weighs
                "disk_tier": self.disk_tier.describe() if self.disk_tier is not None else None}

    def result(self, req: Request) -> GenerationResult:
        """The GenerationResult of a request (finished or not: what it produced so far)."""
        return GenerationResult(
            request_id=req.id, prompt_ids=req.prompt_ids, token_ids=list(req.output_ids),
            text=req.detokenizer.text, finish_reason=req.finish_reason or "abort",
            cached_tokens=req.cached_tokens, logprobs=req.logprobs or None,
            prompt_logprobs=req.prompt_logprobs,
            ttft_s=(req.first_token_time - req.arrival) if req.first_token_time else None,
            queue_s=(req.scheduled_time - req.arrival) if req.scheduled_time else None,
            latency_s=(req.finish_time - req.arrival) if req.finish_time else None,
            error=req.error,
        )

    def cache_stats(self) -> dict:
        """Prefix-cache usage for /metrics: pool slots (free / used), tree tokens and nodes,
        hits and hit tokens, evictions, pool bytes; {"enabled": False} without a prefix cache."""
        if self.prefix is None:
            return {"enabled": False}
        bpt = pool_bytes_per_token(self.compiled.binding.policies)
        return {"enabled": True, **self.prefix.stats(), "pool_bytes": self.runner.prefix_io.nbytes,
                "pool_capacity_bytes": bpt * self.prefix.slots.capacity}


__all__ = ["EngineViews"]
