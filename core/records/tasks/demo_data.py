"""The built-in demo tasks' data, read from `data/demo/` (see data/demo/SOURCES.md) with the studio's own
dataset reader (core.domain.datasets), so the shipped files are checked like a user's."""

from __future__ import annotations

from core.domain.datasets import SampleRow, held_out_personas, read_dataset, scenario_rows
from core.domain.personas import Persona, parse_personas, parse_scenarios
from core.settings import PROJECT_DIR

DEMO_DIR = PROJECT_DIR / "data" / "demo"


def demo_rows() -> list[SampleRow]:
    """The shipped arithmetic demo set (SVAMP + MAWPS MultiArith), train rows first, then test rows."""
    return read_dataset(DEMO_DIR / "arithmetic_train.jsonl", default_split="train") + read_dataset(
        DEMO_DIR / "arithmetic_test.jsonl", default_split="test"
    )


def conversation_demo() -> tuple[list[Persona], list[SampleRow]]:
    """The conversation demo's 12 personas and 36 scenarios (written for this project); one persona of each
    segment is held out for test (held_out_personas)."""
    personas_file = DEMO_DIR / "conversation_personas.json"
    personas = parse_personas(personas_file.read_bytes(), personas_file.name)
    scenarios_file = DEMO_DIR / "conversation_scenarios.json"
    scenarios = parse_scenarios(scenarios_file.read_bytes(), scenarios_file.name, personas)
    return personas, scenario_rows(scenarios, test_personas=held_out_personas(personas))


def support_rows() -> list[SampleRow]:
    """The customer-support demo set (40 messages written for this project), split given per line."""
    return read_dataset(DEMO_DIR / "support_messages.jsonl")


def policy_rows() -> list[SampleRow]:
    """The shop-policies demo set (44 messages written for this project, each with the policy facts its answer
    must state), split given per line."""
    return read_dataset(DEMO_DIR / "policy_messages.jsonl")
