"""The structured replies the engine asks models for, as pydantic models.

Each model is both the contract and the parser: `prompt_schema()` is the JSON schema sent in the
request's `response_format`, and validating a reply with the model applies the same tolerance as the
hand parsers it replaced: every text goes through `clean_text`, empty items are dropped, extra items
are cut off rather than rejected, `ids` may come as `target_ids` or a bare string, and ops may be in
lower case. core.models.gateway.Gateway.complete_json parses a reply with these models (repairing broken
JSON as a last resort) and records on the ledger how it went.

String lengths (`maxLength`) are sent to the embedded model only: llama.cpp enforces them while it
samples, so a tiny model cannot loop inside one string until max_tokens and never close the JSON.
Hosted strict modes may reject the keyword, and their models close their JSON anyway. The learner's texts
(analysis, experiences, operation texts and rationales) carry none: llama.cpp stops a string at its
`maxLength` mid-word ("greenpe", DESIGN §8), and a lesson cut off is worse than none. Their length is asked
for in the prompt, in words, and checked after the reply (core.grpo.training asks again once, then refuses).
"""

from __future__ import annotations

import copy
import functools
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from core.domain.library import ProposedOp

MAX_PROPOSALS = 3
MAX_UPDATE_OPERATIONS = 4
MAX_IDS = 4
MAX_REASON_CHARS = 500
_JSON_ESCAPES = {"\b": "\\b", "\f": "\\f"}


def clean_text(value: object) -> str:
    """Model text decoded from JSON: a LaTeX `\\boxed` written unescaped arrives as a backspace
    and `oxed`; put such escapes back and drop other control characters."""
    text = str(value)
    for char, escaped in _JSON_ESCAPES.items():
        text = text.replace(char, escaped)
    return "".join(c for c in text if c in "\n\t" or ord(c) >= 32).strip()


def _text(value: object) -> str:
    return "" if value is None else clean_text(value)


Text = Annotated[str, BeforeValidator(_text)]


def _limit(chars: int, **kwargs: Any) -> Any:
    """A string-length limit for the prompt's schema (sent to local models only), not a validation rule."""
    return Field(json_schema_extra={"maxLength": chars}, **kwargs)


def _texts(value: object) -> list[str]:
    """A list of texts: numbers become text, other non-text items and empty texts are dropped."""
    if not isinstance(value, list):
        raise ValueError("expected a list of texts")
    texts = (clean_text(t) for t in value if isinstance(t, str | int | float))
    return [t for t in texts if t]


class Reply(BaseModel):
    """A structured reply; `prompt_schema` is the JSON schema the request sends for it."""

    @classmethod
    def prompt_schema(cls, *, local: bool = False) -> dict:
        """The model's JSON schema as strict structured output wants it: nested models inlined, every
        property required, no additional properties, no titles or defaults; `maxLength` for local models only."""
        return copy.deepcopy(_prompt_schema(cls, local))


@functools.cache
def _prompt_schema(model: type[Reply], local: bool) -> dict:
    schema = model.model_json_schema()
    return _strict(schema, schema.get("$defs", {}), local)


def _strict(node: Any, defs: dict, local: bool) -> Any:
    if isinstance(node, list):
        return [_strict(item, defs, local) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _strict(defs[node["$ref"].rsplit("/", 1)[-1]], defs, local)
    out = {}
    for key, value in node.items():
        if key in ("$defs", "title", "default", "description") or (key == "maxLength" and not local):
            continue
        if key == "properties":
            out[key] = {name: _strict(prop, defs, local) for name, prop in value.items()}
        else:
            out[key] = _strict(value, defs, local)
    if out.get("type") == "object" and "properties" in out:
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


class AdvantageReply(Reply):
    """Step 3b: the comparison of a group's attempts and up to three lessons from it."""

    analysis: Text = ""
    experiences: list[str] = Field(json_schema_extra={"maxItems": MAX_PROPOSALS})

    @field_validator("experiences", mode="before")
    @classmethod
    def _proposals(cls, value: object) -> list[str]:
        return _texts(value)[:MAX_PROPOSALS]


def _op(value: object) -> str:
    return str(value).strip().upper()


def _ids(value: object) -> list[str]:
    return [str(i).strip("[] ") for i in (value if isinstance(value, list) else [value])]


class OperationReply(Reply):
    """One operation on the library as the learner wrote it (checked later by core.domain.library.validate_ops)."""

    op: Annotated[Literal["ADD", "MODIFY", "DELETE", "MERGE", "KEEP"], BeforeValidator(_op)]
    ids: list[Annotated[str, _limit(12)]] = Field(json_schema_extra={"maxItems": MAX_IDS})
    text: Text = ""
    rationale: Text = ""

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: object) -> object:
        if not isinstance(data, dict) or "op" not in data:
            raise ValueError("each operation must be an object with an op")
        return {**data, "ids": _ids(data.get("ids") or data.get("target_ids") or []),
                "text": data.get("text") or "", "rationale": data.get("rationale") or ""}

    def proposed(self) -> ProposedOp:
        return ProposedOp(self.op, list(self.ids), self.text or None, self.rationale)


class UpdateReply(Reply):
    """Step 4: the batch's proposals consolidated into operations on the library."""

    # Bounded in the schema so a whole reply fits the learner's token limit: a tiny model otherwise writes
    # ADD after ADD until it is cut off mid-JSON and the batch gets no operations at all.
    operations: list[OperationReply] = Field(json_schema_extra={"maxItems": MAX_UPDATE_OPERATIONS})
    max_operations: ClassVar[int] = MAX_UPDATE_OPERATIONS

    @field_validator("operations", mode="after")
    @classmethod
    def _cut(cls, value: list[OperationReply]) -> list[OperationReply]:
        return value[:cls.max_operations]

    def proposed(self) -> list[ProposedOp]:
        return [operation.proposed() for operation in self.operations]


@functools.cache
def update_reply(max_operations: int = MAX_UPDATE_OPERATIONS) -> type[UpdateReply]:
    """UpdateReply whose schema allows at most `max_operations` operations (the run's setting); extra
    operations in a reply are cut off, not rejected."""
    if max_operations == MAX_UPDATE_OPERATIONS:
        return UpdateReply
    limit = max_operations

    class Limited(UpdateReply):
        operations: list[OperationReply] = Field(json_schema_extra={"maxItems": limit})
        max_operations: ClassVar[int] = limit

    Limited.__name__ = Limited.__qualname__ = "UpdateReply"
    return Limited


class DirectReply(Reply):
    """The paper's baseline: experiences written from the training queries alone."""

    experiences: list[str]

    @field_validator("experiences", mode="before")
    @classmethod
    def _experiences(cls, value: object) -> list[str]:
        texts = _texts(value)
        if not texts:
            raise ValueError("no experiences in the reply")
        return texts


def _steps(value: object) -> list[str]:
    """The steps as a list of texts; one text holding them all is one step."""
    return _texts(value if isinstance(value, list) else [value])


class ExampleReply(Reply):
    """A successful rollout compressed into a worked example (core.domain.prompts.example_messages). Nothing is
    cut: an example over its length limit is refused by validation with its reason, never stored shortened."""

    problem: Text
    steps: Annotated[list[str], BeforeValidator(_steps)]
    answer: Text

    @model_validator(mode="after")
    def _complete(self) -> ExampleReply:
        if not self.problem or not self.steps or not self.answer:
            raise ValueError("a worked example needs a problem, at least one step and an answer")
        return self

    def entry_text(self) -> str:
        """The library entry: one line, as every entry is shown to the agent."""
        steps = " ".join(step if step.endswith((".", "!", "?")) else f"{step}." for step in self.steps)
        answer = self.answer if self.answer.endswith((".", "!", "?")) else f"{self.answer}."
        return f"Problem: {self.problem} Steps: {steps} Answer: {answer}"


class ReferenceReply(Reply):
    """The reply a person would send, written from a reference answer (core.domain.prompts.reference_reply_messages);
    whether it is usable (whole sentences, every part, within the example's limit) is checked after the reply
    (core.domain.reference_answers.unusable), and whether it is right by the task's reward."""

    reply: Text


def _score(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"score must be an integer, got {value!r}")
    return value


class JudgeReply(Reply):
    """The judge's verdict. Validated with `context={"score_range": (low, high)}`, the score must be on
    that scale; `confident` is only false when the judge says exactly false."""

    reason: Annotated[Text, _limit(400)] = ""
    score: Annotated[int, BeforeValidator(_score)]
    confident: Annotated[bool, BeforeValidator(lambda value: value is not False)] = True

    @field_validator("reason")
    @classmethod
    def _short(cls, value: str) -> str:
        return value[:MAX_REASON_CHARS]

    @model_validator(mode="after")
    def _on_scale(self, info: ValidationInfo) -> JudgeReply:
        low, high = (info.context or {}).get("score_range", (None, None))
        if low is not None and not low <= self.score <= high:
            raise ValueError(f"score must be between {low} and {high}, got {self.score}")
        return self
