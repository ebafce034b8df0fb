"""The Python API: what the CLI wraps. Each function returns plain records (dataclasses or dicts)."""
