"""Settings read from the environment, with the embedded defaults a new user gets.

Only names and numbers live here; provider API keys stay in the provider's usual environment
variables (OPENAI_API_KEY, DEEPSEEK_API_KEY, ...) and are read by litellm alone.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "local/qwen2.5-coder-0.5b"


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError as exc:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from exc


def default_model() -> str:
    """The model for every role unless a task, a run or a flag says otherwise."""
    return os.environ.get("TFGRPO_MODEL", DEFAULT_MODEL)


def default_concurrency() -> int:
    """How many calls may be in flight per model."""
    return env_int("TFGRPO_CONCURRENCY", 4)


def local_slots() -> int:
    """Parallel sequences of the embedded model; concurrent calls are batched into them."""
    return env_int("TFGRPO_LOCAL_SLOTS", 4)


def local_context_per_slot() -> int:
    return env_int("TFGRPO_LOCAL_CTX", 4096)


def local_threads() -> int:
    return env_int("TFGRPO_THREADS", os.cpu_count() or 2)


def model_dir() -> Path:
    """Where the assembled GGUF of the embedded model is kept."""
    return Path(os.environ.get("TFGRPO_MODEL_DIR", PROJECT_DIR / ".models"))
