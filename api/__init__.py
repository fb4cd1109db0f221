"""The studio's HTTP API: a thin face over core for live agents (FastAPI; `python -m api` serves it)."""
