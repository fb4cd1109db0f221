"""What a model call costs, from litellm's price map (its bundled copy; see core/models/__init__.py).

One place for the price of a token, so the ledger and the run estimates (core/records/runs/progress.py) agree;
the embedded models are free and a model litellm has no price for costs nothing and is said so as None.
"""

from __future__ import annotations

import contextlib
import functools
import io

from core.models.model_choice import LOCAL_PREFIX


@functools.cache
def price_per_token(model: str) -> tuple[float, float] | None:
    """USD per prompt token and per completion token, or None when litellm knows no price (it prints a
    provider list on a failure, which would land in the app's log: swallowed)."""
    if model.startswith(LOCAL_PREFIX):
        return 0.0, 0.0
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
