"""Structured output with llguidance: JSON schema, any-JSON, regex and Lark grammars per request."""

from .spec import Grammar
from .matcher import GrammarCompiler, GrammarError, GrammarState

__all__ = ["Grammar", "GrammarCompiler", "GrammarError", "GrammarState"]
