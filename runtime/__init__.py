"""graphc runtime."""
