"""core.models.model_choice: the models offered, and a clear refusal of a model the studio cannot call."""

from __future__ import annotations

import pytest

from core.errors import InvalidInput
from core.models.model_choice import PROVIDERS, check_model, known_models
from core.settings import get_settings

SECRET = "sk-test-0123456789-never-shown"


@pytest.fixture(autouse=True)
def no_provider_keys(monkeypatch):
    """Every test starts with no provider configured, whatever the machine's environment holds."""
    for variable, _models in PROVIDERS.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("STUDIO_API_BASE", raising=False)
    monkeypatch.delenv("TOGETHERAI_API_KEY", raising=False)
    monkeypatch.delenv("TFGRPO_MODEL", raising=False)  # the studio's default model is offered too
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def refusal(name: str) -> str:
    with pytest.raises(InvalidInput) as caught:
        check_model(name)
    return str(caught.value)


def test_the_embedded_models_are_always_offered_and_accepted():
    offered = known_models()
    assert offered[:2] == ["local/qwen2.5-coder-0.5b", "local/smollm2-135m"]
    assert not [name for name in offered if not name.startswith("local/")]
    for name in offered:
        check_model(name)


def test_an_empty_or_unknown_embedded_model_is_refused_with_the_known_ones():
    assert refusal("") == "the model is empty: choose one, e.g. local/qwen2.5-coder-0.5b"
    assert refusal("   ") == refusal("")
    assert refusal("local/qwen-7b") == ("model 'local/qwen-7b' is not an embedded model; the embedded ones are "
                                        "local/qwen2.5-coder-0.5b, local/smollm2-135m")


def test_a_provider_without_its_key_is_refused_and_with_it_offered(monkeypatch):
    assert refusal("openai/gpt-4o-mini") == ("model 'openai/gpt-4o-mini' needs OPENAI_API_KEY in the environment of "
                                             "the app and the worker, and it is not set")
    assert "ANTHROPIC_API_KEY" in refusal("anthropic/claude-3-5-haiku-latest")
    assert "TOGETHERAI_API_KEY" in refusal("together_ai/meta-llama/Llama-3-8b-chat-hf")  # litellm knows its key

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    check_model("openai/gpt-4o-mini")
    check_model("openai/any-name-the-provider-has")
    offered = known_models()
    assert "openai/gpt-4o-mini" in offered
    assert not [name for name in offered if name.startswith("anthropic/")]
    assert SECRET not in " ".join(offered)


def test_an_api_base_serves_any_openai_name_without_a_key(monkeypatch):
    with pytest.raises(InvalidInput):
        check_model("openai/my-vllm-model")
    monkeypatch.setenv("STUDIO_API_BASE", "http://127.0.0.1:8000/v1")
    check_model("openai/my-vllm-model")
    check_model("openai/other", api_base=None)
    monkeypatch.delenv("STUDIO_API_BASE")
    check_model("openai/my-vllm-model", api_base="http://127.0.0.1:8000/v1")


def test_a_server_of_ones_own_needs_no_key_and_an_unknown_provider_is_named():
    check_model("ollama/llama3")
    assert refusal("foo/bar") == ("model 'foo/bar': no known provider 'foo'; write it as provider/model, e.g. "
                                  "openai/gpt-4o-mini or ollama/llama3")


def test_the_value_of_a_key_never_appears_in_a_refusal(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    message = refusal("openai/gpt-4o-mini")
    assert SECRET not in message
