"""Which models this studio can call, and a clear refusal of one it cannot, before a run is queued.

A model name is a litellm model string (`openai/gpt-4o-mini`, `anthropic/...`, `ollama/...`) or one of the
embedded models, `local/<name>`. A hosted provider counts as configured when its API key's environment
variable is set; only its presence is read, never its value. STUDIO_API_BASE (an OpenAI-compatible server
such as vLLM or llama.cpp) makes any `openai/<name>` usable. A name that fails here would otherwise fail
only in the worker, minutes later, on the run's first call.
"""

from __future__ import annotations

import contextlib
import io

from sqlalchemy.engine import Engine

from core.errors import InvalidInput
from core.models.connections import resolve as resolve_connection
from core.models.local_model import LOCAL_PREFIX, MODELS
from core.secrets import API_BASE_ENV
from core.settings import get_settings, secret

# Providers this studio offers by name when their key is set: (key variable, a few of their models).
PROVIDERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "openai": ("OPENAI_API_KEY", ("openai/gpt-4o-mini", "openai/gpt-4.1-mini", "openai/gpt-4o")),
    "anthropic": ("ANTHROPIC_API_KEY", ("anthropic/claude-3-5-haiku-latest", "anthropic/claude-sonnet-4-20250514")),
    "deepseek": ("DEEPSEEK_API_KEY", ("deepseek/deepseek-chat", "deepseek/deepseek-reasoner")),
    "gemini": ("GEMINI_API_KEY", ("gemini/gemini-2.0-flash", "gemini/gemini-2.5-flash")),
    "mistral": ("MISTRAL_API_KEY", ("mistral/mistral-small-latest",)),
    "groq": ("GROQ_API_KEY", ("groq/llama-3.1-8b-instant",)),
    "openrouter": ("OPENROUTER_API_KEY", ("openrouter/deepseek/deepseek-chat",)),
}
# Providers that run on a server of the user's own and need no key.
KEYLESS = ("ollama", "ollama_chat", "hosted_vllm", "lm_studio", "llamafile", "vllm")


def local_models() -> list[str]:
    """The embedded models, as model strings (`local/qwen2.5-coder-0.5b`)."""
    return [f"{LOCAL_PREFIX}{name}" for name in MODELS]


def key_is_set(variable: str) -> bool:
    return bool(secret(variable))


def known_models() -> list[str]:
    """The models to offer: the embedded ones, the studio's default model, and a few of every provider whose
    key is set (free text stays possible wherever these are offered)."""
    names = local_models()
    default = get_settings().model
    if default not in names:
        names.append(default)
    for variable, models in PROVIDERS.values():
        if key_is_set(variable):
            names += [m for m in models if m not in names]
    return names


def provider_of(name: str) -> str:
    """The provider litellm would send `name` to; InvalidInput when it knows none. A name that starts with a
    provider this module knows (`openai/...`, `ollama/...`) is that provider, litellm's own answer, without
    importing litellm (2-5 s: a command-line run on an OpenAI-compatible server spent it before its first call,
    and its calls go through core/models/openai_http.py). litellm prints its provider list on a failure, which
    would land in the app's log, so its output is swallowed."""
    prefix = name.split("/", 1)[0] if "/" in name else ""
    if prefix in PROVIDERS or prefix in KEYLESS:
        return prefix
    import litellm  # here, not at the top: a studio on the embedded model never asks litellm (~5 s to import)

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return litellm.get_llm_provider(name)[1]
    except Exception as exc:  # noqa: BLE001  (litellm raises its own BadRequestError for an unknown provider)
        prefix = name.split("/", 1)[0] if "/" in name else name
        raise InvalidInput(f"model {name!r}: no known provider {prefix!r}; write it as provider/model, e.g. "
                           "openai/gpt-4o-mini or ollama/llama3") from exc


def check_model(name: str, api_base: str | None = None, engine: Engine | None = None) -> None:
    """Refuse a model this studio cannot call, with a sentence saying why: empty, an unknown embedded model,
    an unknown provider or model connection, or a key that is not set (`api_base` or STUDIO_API_BASE serve
    any openai/ name without one). With `engine`, `<connection>/<model>` names one of its model connections."""
    name = (name or "").strip()
    if not name:
        raise InvalidInput("the model is empty: choose one, e.g. " + local_models()[0])
    connection = resolve_connection(engine, name) if engine is not None else None
    if connection is not None:
        if connection.key_env and not key_is_set(connection.key_env):
            raise InvalidInput(f"model {name!r} goes through the connection {connection.connection!r}, whose key "
                               f"variable {connection.key_env} is not set in the environment of the app and the worker")
        return
    if name.startswith(LOCAL_PREFIX):
        if name.removeprefix(LOCAL_PREFIX) not in MODELS:
            raise InvalidInput(f"model {name!r} is not an embedded model; the embedded ones are "
                               f"{', '.join(local_models())}")
        return
    provider = provider_of(name)
    if provider in KEYLESS:
        return
    if provider == "openai" and (api_base or key_is_set(API_BASE_ENV)):
        return
    variable = PROVIDERS.get(provider, (None,))[0] or missing_key(name)
    if variable and not key_is_set(variable):
        raise InvalidInput(f"model {name!r} needs {variable} in the environment of the app and the worker, "
                           "and it is not set")


def missing_key(name: str) -> str | None:
    """The API key variable litellm says a model of another provider needs and is not set, if any; credentials
    that may come from files instead (AWS, Google Cloud) are left for the first call to check."""
    import litellm

    with contextlib.redirect_stdout(io.StringIO()):
        try:
            missing = litellm.validate_environment(model=name).get("missing_keys") or []
        except Exception:  # noqa: BLE001  (a provider litellm cannot check: let the first call say)
            return None
    return next((key for key in missing if key.endswith("_API_KEY")), None)
