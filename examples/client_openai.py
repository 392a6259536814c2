"""Talk to `graphc serve` with the official openai client.

    graphc make-model --arch llama --out /tmp/tiny-llama      # or use any mlx-lm model folder
    graphc serve --model /tmp/tiny-llama &                    # http://127.0.0.1:8000
    python examples/client_openai.py                          # --base-url / --api-key to change

Shows: listing models, a completion, a chat, streaming with usage, n choices, graphc's
extra sampling fields through `extra_body`, structured output, and an error.
"""

from __future__ import annotations

import argparse
import json

import openai


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="unused", help="what `graphc serve --api-key` was given (if anything)")
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    print(f"model: {model}")

    # A plain completion, greedy.
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0)
    print(f"\ncompletion ({r.choices[0].finish_reason}): {r.choices[0].text!r}")
    print(f"usage: {r.usage.prompt_tokens} prompt (+{r.usage.prompt_tokens_details.cached_tokens} cached), "
          f"{r.usage.completion_tokens} completion")

    # Chat through the model's own chat template, streamed, with the usage in a last chunk.
    print("\nchat (streamed): ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tell me a short story."}],
        max_completion_tokens=32, temperature=0.7, seed=1, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        elif chunk.usage:
            print(f"\n[usage: {chunk.usage.completion_tokens} tokens]")

    # Several choices, with the sampling fields OpenAI's API lacks sent through extra_body.
    r = client.completions.create(model=model, prompt="The dragon", n=3, max_tokens=12, temperature=0.9, seed=7,
                                  stop=["\n"], extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1})
    for c in r.choices:
        print(f"\nchoice {c.index}: {c.text!r}")

    # Structured output: the grammar guarantees the shape, whatever the model.
    schema = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "stars": {"enum": [1, 2, 3]}},
              "required": ["mood", "stars"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Rate your day."}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "rating", "schema": schema}})
    doc = json.loads(r.choices[0].message.content)
    print(f"\njson_schema: {json.dumps(doc)}")

    # Errors come back as OpenAI errors.
    try:
        client.completions.create(model=model, prompt="x", top_p=0)
    except openai.BadRequestError as e:
        print(f"\nerror {e.status_code}: {e.body['message']} (param={e.body['param']})")


if __name__ == "__main__":
    main()
