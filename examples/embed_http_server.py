"""Embed graphc in a web app of another framework: the standard library's http.server.

    python examples/embed_http_server.py --model /tmp/tiny-llama --port 8080
    curl -s localhost:8080/generate -d '{"prompt": "Once upon a time", "max_tokens": 20}'
    curl -sN localhost:8080/stream -d '{"prompt": "Once upon a time", "max_tokens": 40}'

ThreadingHTTPServer runs each request on its own thread and has no event loop, so the
handlers use AsyncEngine's blocking API: `generate_blocking` and `iter_blocking`. The
engine itself runs on AsyncEngine's thread; handler threads only submit work and wait
for deltas, so many requests decode together in one batch. A client that hangs up
mid-stream makes the write fail; closing the iterator then aborts its request.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from graphc.runtime import AsyncEngine, Engine, SamplingParams

MAX_BODY = 1 << 20


def make_server(aengine: AsyncEngine, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streaming needs 1.1

        def _json(self, status: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _request(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise ValueError("body too large")
            data = json.loads(self.rfile.read(n) or b"{}")
            params = SamplingParams(max_tokens=int(data.get("max_tokens", 32)),
                                    temperature=float(data.get("temperature", 0.0)), seed=data.get("seed"))
            return data.get("prompt", ""), params

        def do_GET(self):
            if self.path == "/health":
                snap = aengine.snapshot
                self._json(200, {"ok": aengine.alive, "running": snap.running, "waiting": snap.waiting})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            try:
                prompt, params = self._request()
                if self.path == "/generate":
                    res = aengine.generate_blocking(prompt, params, timeout=300)
                    return self._json(200, {"text": res.text, "finish_reason": res.finish_reason,
                                            "prompt_tokens": len(res.prompt_ids), "tokens": len(res.token_ids)})
                if self.path == "/stream":
                    return self._stream(prompt, params)
                self._json(404, {"error": "not found"})
            except ValueError as e:  # bad JSON, bad params, an empty prompt: the client's fault
                self._json(400, {"error": str(e)})

        def _stream(self, prompt, params):
            it = aengine.iter_blocking(prompt, params, timeout=300)  # raises ValueError before any bytes go out
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with it:  # leaving the block early (client gone) aborts the request
                try:
                    for out in it:
                        if out.new_text:
                            data = out.new_text.encode()
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        def log_message(self, fmt, *args):  # keep the terminal for the model's output
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model folder (default: the built-in demo model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args()

    aengine = AsyncEngine.load(lambda: Engine.load(args.model))  # loaded on the engine thread
    # before traffic, on the engine thread (MLX's CUDA backend keeps attention plans per thread)
    print(f"warmed up in {aengine.warm_up():.1f} s")
    server = make_server(aengine, args.host, args.port)
    print(f"serving on http://{args.host}:{server.server_address[1]} (POST /generate, POST /stream, GET /health)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        aengine.shutdown()  # aborts what is still running and joins the engine thread


if __name__ == "__main__":
    main()
