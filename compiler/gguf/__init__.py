"""GGUF import: llama.cpp / Ollama model files -> mlx-lm model folders (see docs/gguf.md)."""

from .convert import CONVERTER_VERSION, import_gguf, is_gguf, resolve_model_path
from .reader import GGUFError, read_header
from .weights import summary_lines

__all__ = ["CONVERTER_VERSION", "GGUFError", "import_gguf", "is_gguf", "read_header", "resolve_model_path", "summary_lines"]
