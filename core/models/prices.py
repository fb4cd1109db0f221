"""What a model call costs, from litellm's price map (its bundled copy; see core/models/__init__.py).

One place for the price of a token, so the ledger and the run estimates (core/records/runs/progress.py) agree;
the embedded models are free and a model litellm has no price for costs nothing and is said so as None.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
from pathlib import Path

from core.models.model_choice import LOCAL_PREFIX

OWN_PATH = "openai"  # models the studio calls itself (core/models/openai_http.py): priced from the map alone


@functools.cache
def _price_map() -> dict:
    """litellm's bundled price map, read as the JSON file it ships (not through an import of litellm)."""
    spec = importlib.util.find_spec("litellm")
    folder = Path(spec.origin).parent if spec is not None and spec.origin else None
    path = folder / "model_prices_and_context_window_backup.json" if folder else None
    if path is None or not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _mapped(model: str) -> tuple[float, float] | None:
    """The map's prices for `model` by its own name, or by the name after its provider where the map's entry is
    that provider's."""
    prices = _price_map()
    provider, _, bare = model.partition("/")
    entry = prices.get(model) or (prices.get(bare) if bare and (prices.get(bare) or {}).get("litellm_provider")
                                  == provider else None)
    if not entry or entry.get("input_cost_per_token") is None or entry.get("output_cost_per_token") is None:
        return None
    return float(entry["input_cost_per_token"]), float(entry["output_cost_per_token"])


@functools.cache
def price_per_token(model: str) -> tuple[float, float] | None:
    """USD per prompt token and per completion token, or None when the price map knows none.

    Read from the map's file first: an `openai/` model (a hosted OpenAI model, or any model of an
    OpenAI-compatible server, which the map cannot know) is priced by it alone, so a run on such a server never
    imports litellm (2-5 s, paid on the run's first call). Other providers' names that the file does not hold
    ask litellm, which knows their aliases (it prints a provider list on a failure, which would land in the
    app's log: swallowed)."""
    if model.startswith(LOCAL_PREFIX):
        return 0.0, 0.0
    found = _mapped(model)
    if found is not None or model.partition("/")[0] == OWN_PATH:
        return found
    import litellm  # here, not at the top: the embedded models' prices need no litellm (~5 s to import)

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            prompt, completion = litellm.cost_per_token(model=model, prompt_tokens=1_000_000,
                                                         completion_tokens=1_000_000)
    except Exception:  # noqa: BLE001  (litellm raises its own errors for unknown models and providers)
        return None
    return prompt / 1_000_000, completion / 1_000_000


def token_cost(model: str, tokens_in: int, tokens_out: int) -> float:
    """The price of `tokens_in` prompt and `tokens_out` completion tokens; an unpriced model is free."""
    prices = price_per_token(model)
    return 0.0 if prices is None else tokens_in * prices[0] + tokens_out * prices[1]
