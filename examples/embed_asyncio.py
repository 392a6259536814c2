"""The embedding API from asyncio: Engine.stream on your loop, or AsyncEngine on its own thread.

    python examples/embed_asyncio.py --model /tmp/tiny-llama

See docs/embedding.md for which calls are thread-safe.
"""

from __future__ import annotations

import argparse
import asyncio

from graphc.runtime import AsyncEngine, Engine, SamplingParams


async def on_the_callers_loop(engine: Engine) -> None:
    """Engine.stream: the engine steps on this event loop. Simple; each step blocks the loop briefly."""
    params = SamplingParams(max_tokens=24)
    print("Engine.stream: ", end="")
    async for out in engine.stream("Once upon a time", params):
        print(out.new_text, end="", flush=True)
    print(f"  [{out.finish_reason}]")


async def on_its_own_thread(engine: Engine) -> None:
    """AsyncEngine: the engine runs on a background thread; the loop only awaits deltas."""
    aengine = AsyncEngine(engine)
    try:
        async def one(i: int) -> str:
            text = ""
            async for out in aengine.stream(f"Story {i}:", SamplingParams(max_tokens=16)):
                text += out.new_text
            return text

        # Four requests decode together in one batch.
        for i, text in enumerate(await asyncio.gather(*[one(i) for i in range(4)])):
            print(f"AsyncEngine #{i}: {text!r}")

        # Leaving a stream early aborts its request and frees its cache rows.
        async for out in aengine.stream("A very long tale", SamplingParams(max_tokens=2000)):
            break
        res = await aengine.generate("Once upon a time", SamplingParams(max_tokens=8))
        print(f"generate(): {res.text!r} ({len(res.token_ids)} tokens, ttft {res.ttft_s * 1000:.1f} ms)")
    finally:
        aengine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model folder (default: the built-in demo model)")
    args = ap.parse_args()
    engine = Engine.load(args.model)
    asyncio.run(on_the_callers_loop(engine))
    asyncio.run(on_its_own_thread(engine))


if __name__ == "__main__":
    main()
