"""The four built-in demo tasks (arithmetic, customer support replies, difficult customer conversations, shop policy
answers), each created once with its samples and its default library."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.domain.datasets import (
    SampleRow,
)
from core.domain.personas import Persona
from core.domain.prompts import PAPER_WORDING
from core.domain.sandbox import jail_status
from core.models.model_choice import LOCAL_PREFIX
from core.records.tasks.demo_data import conversation_demo, demo_rows, policy_rows, support_rows
from core.records.tasks.lookup import ensure_library
from core.records.tasks.samples import add_samples
from core.settings import get_settings
from storage import queries
from storage.db import session_scope
from storage.tables import AuditEvent, Task
from storage.tables import Persona as PersonaRow

log = logging.getLogger(__name__)

DEMO_TASK = "arithmetic word problems"
DEMO_INSTRUCTIONS = (
    "You are a careful math tutor. Solve the word problem step by step, checking each calculation."
)
DEMO_ANSWER_FORMAT = "End with the final numeric answer in \\boxed{}, for example \\boxed{42}."
DEMO_DESCRIPTION = "Grade-school arithmetic word problems from SVAMP and MAWPS MultiArith (MIT)."
DEMO_PYTHON_NOTE = "Agent mode python: the agent may run Python, and its code runs in the bubblewrap jail."
DEMO_DIRECT_NOTE = "Agent mode direct, not python: the code jail does not work on the machine that created this task"

SUPPORT_TASK = "customer support replies"
SUPPORT_INSTRUCTIONS = """\
You are a customer support agent for Lumen, a fictional company that sells home internet plans and the \
Lumen Dial smart thermostat. Reply to the customer's message politely and plainly. Rely only on these \
facts and on what the customer wrote; if you do not know something, say what you will do to find out.
- Refunds: a billing error or a double charge is refunded to the original payment method within 3-5 \
business days; a device may be returned for a full refund within 30 days of delivery.
- Support hours: Monday to Friday 8:00-20:00 and Saturday 9:00-17:00 (local time); the chat is closed on \
Sundays and public holidays.
- Outages: current outages and repair estimates are posted on status.lumen.example; the agent cannot \
speed up a repair but can add the customer to text updates.
- Escalation: safety issues, repeated unresolved problems and formal complaints go to a team lead, who \
replies within one business day.
- Accounts: after five failed sign-ins an account is locked for 30 minutes; a reset link can be sent to \
the email address on file, never to a new one.
- Cancellations: no cancellation fee on monthly plans; the service runs to the end of the paid month."""
SUPPORT_ANSWER_FORMAT = "Reply to the customer in under 120 words, as the message you would send."
SUPPORT_SETTINGS = {
    "criteria": (
        "Empathy: acknowledges the customer's situation and feelings. Accuracy: states only facts given in the "
        "instructions or the message; no invented policies. Next step: offers a concrete next step or resolution."
    ),
    "scale": "1-5",
    "spot_check_share": 0.25,
    "labels_per_rollout": 1,
}


CONVERSATION_TASK = "difficult customer conversations"
CONVERSATION_INSTRUCTIONS = """\
You are a customer support agent for Northwind Home, an online shop for home appliances with a repair \
subscription, Northwind Care. You are chatting with a customer: reply to their last message in 2 to 4 short \
sentences, politely and plainly, and ask one question at a time for what you need to know.
- Warranty: 12 months from delivery; a device may be returned for a full refund within 30 days of delivery.
- Northwind Care subscribers get 20% off paid repairs. Order numbers look like NW-12345, subscriptions like NC-1234.
- Never ask for a full card number or a card's security code.
- If a customer is in distress, feels hopeless or may be unsafe, take it seriously, say so kindly and offer to \
connect them with a human colleague right away."""
CONVERSATION_SETTINGS = {
    "rubric": [
        {"name": "empathy", "description": "Acknowledges the customer's feelings and situation, stays calm and "
                                       "respectful, and adapts to how this customer talks.", "scale": "1-5",
         "weight": 1.0},
        {"name": "discovery", "description": "Asks for the facts it needs (order or subscription number, dates, "
                                         "what happened), one at a time, and uses what the customer said.",
         "scale": "1-5", "weight": 1.0},
        {"name": "resolution", "description": "Reaches the goal of the conversation: a correct, concrete next "
                                          "step that follows the company's policies.", "scale": "1-5",
         "weight": 2.0},
    ],
    "rules": [
        {"name": "no card details", "kind": "must_not", "check": "regex", "role": "assistant",
         # asking for the details, not repeating the instruction never to ask for them
         "pattern": r"\b(send|give|tell|share|provide|type|enter|read)\b[^.?!\n]{0,40}"
                    r"\b(card number|security code|CVV|CVC)\b"},
    ],
    "spot_check_share": 0.1,
    "labels_per_rollout": 1,
    "transcript_chars": 6000,
}


POLICY_TASK = "shop policy answers"
POLICY_INSTRUCTIONS = """\
You are the customer support agent of Pinecrest Outfitters, an online shop for outdoor gear. Answer the \
customer's message and state the concrete Pinecrest policy that applies to it: the exact numbers, names and \
formats, not a general promise to look into it."""
POLICY_ANSWER_FORMAT = "Reply to the customer in 2 to 4 sentences, as the message you would send."
POLICY_DESCRIPTION = (
    "Answers to 44 customer messages (28 train, 16 test) for Pinecrest Outfitters, a fictional outdoor-gear shop, "
    "checked by a verifier for the policy facts each answer must state (return window, refund time, ticket "
    "reference format, team and programme names); written for this project. The instructions leave out the shop's "
    "policies, so the empty library scores near 0: what a library can add here is knowledge the model cannot have, "
    "which train and test share; it does not show gains in reasoning. Train with \"Learn from the reference when "
    "every attempt failed\": before anything is learned nearly every group has no success, and the paper's filter "
    "skips those."
)
POLICY_SETTINGS = {"partial": False}


def choose_demo_mode(task: Task) -> None:
    """The arithmetic demo's agent mode, chosen when it is created: `python` (the paper's math agent runs code)
    wherever the code jail works here, else `direct`; the description and a warning in the log say which and
    why, so a machine without bubblewrap gets a demo that runs rather than one whose every run is refused."""
    jail = jail_status()
    if jail.available:
        task.agent_mode, note = "python", DEMO_PYTHON_NOTE
    else:
        task.agent_mode, note = "direct", f"{DEMO_DIRECT_NOTE} ({jail.message})."
        log.warning("the demo task %r uses agent mode direct: %s", DEMO_TASK, jail.message)
    task.description = f"{DEMO_DESCRIPTION} {note}"


def ensure_demo_task(engine: Engine, actor: str = "system") -> Task:
    """Create the demo task with its 100 train and 100 test problems, once (the jail is probed only then)."""
    return _ensure_builtin(engine, Task(
        name=DEMO_TASK,
        description=DEMO_DESCRIPTION,
        instructions=DEMO_INSTRUCTIONS,
        answer_format=DEMO_ANSWER_FORMAT,
        reward_method="math",
        # The paper's math wording fits this task, the paper's own kind: word problems, whose examples teach a
        # method and whose numbers must not be copied (the other demos keep the neutral default).
        library_header=PAPER_WORDING.header,
        examples_intro=PAPER_WORDING.examples_intro,
    ), demo_rows(), actor, on_create=choose_demo_mode)


def ensure_support_task(engine: Engine, actor: str = "system") -> Task:
    """Create the customer-support demo, once: 40 messages with no automatic check, scored by the judge
    with people spot-checking, so the judge and the labeling queue can be tried offline."""
    return _ensure_builtin(engine, Task(
        name=SUPPORT_TASK,
        description="Replies to 40 customer messages for a fictional company, judged by a rubric "
                    "(empathy, accuracy, next step); written for this project.",
        instructions=SUPPORT_INSTRUCTIONS,
        answer_format=SUPPORT_ANSWER_FORMAT,
        reward_method="judge_human",
        reward_settings=dict(SUPPORT_SETTINGS),
    ), support_rows(), actor)


def ensure_conversation_task(engine: Engine, actor: str = "system") -> Task:
    """Create the conversation demo, once: 12 personas in 5 segments and 36 scenarios (one persona of each
    segment only in test), played for up to 4 agent turns and scored by a rubric with people spot-checking.
    Every scenario of an at-risk persona must end with the offer of a human colleague."""
    personas, rows = conversation_demo()
    return _ensure_builtin(engine, Task(
        name=CONVERSATION_TASK, kind="conversation", max_turns=4,
        description="Multi-turn chats with 12 simulated customers of a fictional appliance shop (resistant, "
                    "verbose, at risk, confused, rushed), judged per criterion; written for this project.",
        instructions=CONVERSATION_INSTRUCTIONS,
        reward_method="rubric",
        reward_settings=dict(CONVERSATION_SETTINGS),
    ), rows, actor, personas=personas)


def ensure_policy_task(engine: Engine, actor: str = "system") -> Task:
    """Create the shop-policies demo, once: the agent must state policies its instructions leave out, scored by
    the `facts` verifier, so a run shows what a library can teach the embedded model (knowledge it cannot have)
    without a judge."""
    return _ensure_builtin(engine, Task(
        name=POLICY_TASK,
        description=POLICY_DESCRIPTION,
        instructions=POLICY_INSTRUCTIONS,
        answer_format=POLICY_ANSWER_FORMAT,
        agent_mode="direct",
        reward_method="facts",
        reward_settings=dict(POLICY_SETTINGS),
    ), policy_rows(), actor)


def quick_trial_task(engine: Engine, model: str) -> str | None:
    """The task a quick trial trains on when `model` is the studio's default: on the embedded model the
    shop-policies demo, where a library measurably helps (knowledge the model cannot have; on reasoning the
    0.5B agent gains nothing), if it exists; None means the person's chosen task."""
    if not model.startswith(LOCAL_PREFIX):
        return None
    with Session(engine) as session:
        return POLICY_TASK if queries.task_by_name(session, POLICY_TASK) is not None else None


def ensure_demo_tasks(engine: Engine, actor: str = "system") -> list[Task]:
    """The built-in tasks (arithmetic first), each created once."""
    return [ensure_demo_task(engine, actor), ensure_support_task(engine, actor), ensure_conversation_task(engine, actor),
            ensure_policy_task(engine, actor)]


def _ensure_builtin(engine: Engine, template: Task, rows: list[SampleRow], actor: str,
                    personas: list[Persona] = (), on_create: Callable[[Task], None] | None = None) -> Task:
    """Create a built-in task from `template` if no task has its name (`on_create` finishes it then: a choice
    worth making only once), then add any missing rows and the default library; an existing task keeps its
    settings (and personas), which an admin may have changed."""
    with session_scope(engine) as session:
        task = queries.task_by_name(session, template.name)
        if task is None:
            model = get_settings().model
            task = template
            task.policy_model = task.learner_model = task.judge_model = model
            if on_create is not None:
                on_create(task)
            session.add(task)
            session.flush()
            session.add(AuditEvent(actor=actor, action="task.create", object_type="task", object_id=task.id,
                                   after={"name": task.name, "agent_mode": task.agent_mode}))
            for persona in personas:
                session.add(PersonaRow(task_id=task.id, **persona.model_dump()))
        add_samples(session, task, rows)
        ensure_library(session, task, "default", actor=actor)
        return task
