"""`graphc bench --serving`: a load generator against OpenAI-compatible servers (docs/serving-bench.md)."""
