"""Handing a step's stream events from the engine thread to the server's event loop: one
`call_soon_threadsafe` per event against one per step for all of them (runtime/async_streams.py
`deliver_all`, AsyncEngine._send). A producer thread plays the engine: STREAMS events per step,
a pause between steps; the loop runs one consumer task per stream, as the server's streams do.
Prints the loop thread's CPU per event and the producer's wall time around each step's hand-over.

    python benchmarks/probes/loop_handoff.py [--streams 64] [--steps 300] [--gap-ms 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time


async def run(streams: int, steps: int, gap: float, batched: bool) -> tuple[float, float]:
    """(loop CPU seconds per event, producer seconds per step's hand-over)."""
    loop = asyncio.get_running_loop()
    queues = [asyncio.Queue() for _ in range(streams)]

    async def consumer(q):
        while await q.get() is not None:
            pass

    def deliver(items):
        for q, v in items:
            q.put_nowait(v)

    handoff = []

    def producer():
        for s in range(steps):
            t0 = time.perf_counter()
            if batched:
                loop.call_soon_threadsafe(deliver, [(q, s) for q in queues])
            else:
                for q in queues:
                    loop.call_soon_threadsafe(q.put_nowait, s)
            handoff.append(time.perf_counter() - t0)
            time.sleep(gap)
        loop.call_soon_threadsafe(deliver, [(q, None) for q in queues])

    tasks = [asyncio.create_task(consumer(q)) for q in queues]
    cpu0 = time.thread_time()
    th = threading.Thread(target=producer)
    th.start()
    await asyncio.gather(*tasks)
    cpu = time.thread_time() - cpu0
    th.join()
    return cpu / (streams * steps), statistics.median(handoff)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--gap-ms", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    for _ in range(a.repeats):
        for batched in (False, True):
            per_event, handoff = asyncio.run(run(a.streams, a.steps, a.gap_ms / 1e3, batched))
            print(f"{'one call a step ' if batched else 'one call an event'}: loop CPU {per_event * 1e6:.1f} us/event, "
                  f"hand-over {handoff * 1e3:.3f} ms/step (median)", flush=True)


if __name__ == "__main__":
    main()
