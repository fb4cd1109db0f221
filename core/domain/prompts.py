"""Every prompt the engine sends (the structured replies' JSON schemas come from their core.domain.replies models).

Kept in one place so that a change of wording is one diff, and so that the cache key of a call
(which includes its messages) only changes when a prompt really changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from core.domain.fencing import Fence
from core.domain.library import EXAMPLE_MAX_WORDS, examples, lessons, render_for_learner
from core.domain.library_io import to_prompt_block
from core.domain.personas import Persona, Scenario
from core.domain.replies import MAX_PROPOSALS, MAX_UPDATE_OPERATIONS

REJECTED_SHOWN = 10  # the most recent rejections of a run the learner is told about
REJECTED_CHARS = 240  # each rejected text and each reason, clipped to this many characters
# The output fence is the one core.domain.code_runs sends back, so the model is told what it will read.
PYTHON_TOOL_NOTE = (
    "You can run Python: write code in a ```python fenced block and stop; the code is executed and its "
    "output is sent back to you in an ```output block, then you continue. Use print() to see values. "
    "Never write an ```output block yourself."
)


def _chat(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# The line above the library and the line that opens its worked examples are a task's settings (Task.library_header,
# Task.examples_intro; None is the neutral default below). The paper's wording was written for a math agent: a
# support agent solves no "problems", and "not the numbers" tells it to ignore exactly what a policy example
# teaches (issue 36: replies echoed the header, and an agent answered with a number from an example's question).
PAPER_LIBRARY_HEADER = ("When solving problems, you MUST first carefully read and understand the helpful instructions "
                        "and experiences:")
PAPER_EXAMPLES_INTRO = "Worked examples of similar problems, solved correctly (follow the method, not the numbers):"
LIBRARY_HEADER = "Before you answer, read these experiences carefully; they were learned from earlier tasks like this one:"
# core.domain.library_io reads a pasted prompt block back by the first words "Worked examples" (or by the task's
# own intro, given to it), so the default starts with them.
EXAMPLES_INTRO = "Worked examples of similar tasks, each answered correctly:"
MAX_WORDING_CHARS = 500  # each of the two lines; one line each, so a pasted prompt block reads back


@dataclass(frozen=True)
class LibraryWording:
    """The two lines of a library block that are a task's to choose: the header above the library and the line
    that introduces its worked examples. `of(task)` reads a task's (None or blank: the neutral default)."""

    header: str = LIBRARY_HEADER
    examples_intro: str = EXAMPLES_INTRO

    @classmethod
    def of(cls, task: object | None) -> LibraryWording:
        """The wording of a task (any object with `library_header` and `examples_intro`; None: the defaults)."""
        header = " ".join(str(getattr(task, "library_header", None) or "").split())
        intro = " ".join(str(getattr(task, "examples_intro", None) or "").split())
        return cls(header or LIBRARY_HEADER, intro or EXAMPLES_INTRO)


DEFAULT_WORDING = LibraryWording()
PAPER_WORDING = LibraryWording(PAPER_LIBRARY_HEADER, PAPER_EXAMPLES_INTRO)


def library_block(experiences: list[dict], wording: LibraryWording = DEFAULT_WORDING) -> str:
    """The library as the agent reads it ("" when empty): the task's header, the lessons one a line by id,
    `[E1] ...` (the paper numbers them `[G0]. ...`; library_io.to_prompt_block says why ids), then the worked
    examples apart under the task's intro line, `[E5] ...`. A library (or a query's selection) of worked
    examples only opens with their intro alone: the header announces lessons that are not there, and two
    introductions back to back read as one garbled one. The agent prompt (rollouts, evaluations, the gate,
    conversations), the `prompt` export and the HTTP API all render a library with this."""
    if not experiences:
        return ""
    parts = [f"{wording.header}\n{to_prompt_block(lessons(experiences))}"] if lessons(experiences) else []
    if examples(experiences):
        parts.append(f"{wording.examples_intro}\n{to_prompt_block(examples(experiences))}")
    return "\n\n".join(parts)


def agent_system_prompt(instructions: str, answer_format: str, experiences: list[dict], python_tool: bool,
                        wording: LibraryWording = DEFAULT_WORDING) -> str:
    """The agent's system prompt: the task's instructions, then the library (library_block, in the task's wording)."""
    parts = [instructions.strip()]
    if answer_format.strip():
        parts.append(answer_format.strip())
    if python_tool:
        parts.append(PYTHON_TOOL_NOTE)
    if experiences:
        parts.append(library_block(experiences, wording))
    return "\n\n".join(parts)


def agent_messages(instructions: str, answer_format: str, experiences: list[dict], query: str,
                   python_tool: bool, wording: LibraryWording = DEFAULT_WORDING) -> list[dict]:
    return _chat(agent_system_prompt(instructions, answer_format, experiences, python_tool, wording), query)


def trajectory_text(messages: list[dict], limit: int = 6000) -> str:
    """The agent's side of a rollout (everything after the query), shortened for the learner."""
    lines = []
    for message in messages[2:]:
        who = "Agent" if message["role"] == "assistant" else "Tool output"
        lines.append(f"{who}:\n{message['content']}")
    text = "\n\n".join(lines)
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


def _reference_block(reference: str | None, reward: float | None, ground_truth: bool) -> str:
    if not ground_truth:
        return ""
    parts = []
    if reference:
        parts.append(f"Reference answer: {reference}")
    if reward is not None:
        parts.append(f"Reward of this attempt: {reward:g} ({'correct' if reward >= 0.5 else 'wrong'})")
    return "\n".join(parts) + "\n\n" if parts else ""


CONVERSATION_NOTE = (" The attempt is a conversation: name the turn (Turn N) where it went right or wrong, and how "
                     "the agent's words changed what the user did next.")


# What a summary is asked for, and the tokens it may take: about twice the words. A small learner that loops
# (5 of 12 summaries of the embedded model ran to the learner's 768-token limit in one run) stops there, so the
# advantage prompt that carries four summaries stays short and a loop costs seconds, not a minute.
SUMMARY_WORDS = 120
SUMMARY_TOKENS = 2 * SUMMARY_WORDS + 80


def summary_messages(query: str, reference: str | None, reward: float | None, experiences: list[dict],
                     trajectory: str, ground_truth: bool, conversation: bool = False) -> list[dict]:
    """Step 3a of the paper: summarise one attempt, which experiences it used and where it went wrong."""
    content = (
        f"An AI agent attempted the following task.\n\nTask:\n{query}\n\n"
        f"{_reference_block(reference, reward, ground_truth)}"
        f"Experiences the agent was given:\n{render_for_learner(experiences)}\n\n"
        f"The agent's attempt:\n{trajectory}\n\n"
        f"Summarise the attempt step by step in at most {SUMMARY_WORDS} words: the approach it took, which of the "
        "experiences (by id) it used or ignored, and"
        + (" where and why it went wrong, if it did." if ground_truth else " any step that looks doubtful.")
        + (CONVERSATION_NOTE if conversation else "")
    )
    return _chat("You analyse an agent's reasoning precisely and briefly.", content)


def advantage_messages(query: str, reference: str | None, attempts: list[tuple[float | None, str]],
                       experiences: list[dict], ground_truth: bool, conversation: bool = False,
                       reference_side: bool = False) -> list[dict]:
    """Step 3b: compare the group's summaries and write the semantic advantage as lessons.

    `reference_side`: every attempt failed, so the reference answer is the successful side of the comparison;
    what it states that the attempts lacked may be knowledge the agent could not have (a policy, a format, a
    name), which is then worth a lesson even though it is a fact of the domain."""
    lines = []
    for i, (reward, summary) in enumerate(attempts, 1):
        label = f" (reward {reward:g})" if ground_truth and reward is not None else ""
        lines.append(f"Attempt {i}{label}:\n{summary}")
    if reference_side and reference:
        lines.append(f"Reference answer (the successful side; written by a person, not an attempt):\n{reference}")
        task = ("Every attempt failed. What does the reference answer state or do that the attempts did not, and "
                "which of it is knowledge the agent could not have known (a rule, a policy, a format, a name)")
        scope = ("general, reusable lessons for similar tasks; a rule, policy, format or name of this domain that "
                 "the reference shows is welcome, stated so it applies to other tasks (not a number that belongs "
                 "only to this one)")
    else:
        if len(attempts) == 1:
            task = "Critique this single attempt"
        elif ground_truth:
            task = "Compare the attempts: what did the better ones do that the worse ones did not"
        else:
            task = "Compare the attempts and judge which reasoning is most reliable and why"
        scope = "general, reusable lessons for similar tasks (not facts about this task's numbers or names)"
    content = (
        f"Task:\n{query}\n\n"
        + (f"Reference answer: {reference}\n\n" if ground_truth and reference and not reference_side else "")
        + f"Current experiences:\n{render_for_learner(experiences)}\n\n"
        + "\n\n".join(lines)
        + f"\n\n{task}?"
        + (" These attempts are conversations: say which turn made the difference." if conversation else "")
        + f" Then write at most {MAX_PROPOSALS} new experiences: {scope}, each one sentence of at most 32 words. "
        'Reply with JSON only: {"analysis": "...", "experiences": ["...", "..."]}'
    )
    return _chat("You turn an agent's successes and failures into short, general lessons.", content)


def _clip(text: str, limit: int = REJECTED_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _rejected_block(rejected: Sequence[tuple[str, str]]) -> str:
    """Operations people (or the validation gate) rejected earlier in the run, with why: not to be proposed again."""
    if not rejected:
        return ""
    lines = "\n".join(f"Rejected earlier: {_clip(text)} — rejected because {_clip(reason)}"
                      for text, reason in list(rejected)[-REJECTED_SHOWN:])
    return f"Operations rejected earlier in this run (do not propose them again):\n{lines}\n\n"


# What a learner prompt shows where an id goes: the embedded learner copied example ids such as ["E2"] into its
# operations (11 of 14 invalid in one run, issue 26), so a prompt shows no id that the library it shows lacks.
ID_PLACEHOLDER = "<id of an experience shown above>"
EXPERIENCE_ID = re.compile(r"\bE\d+\b")
LESSON_WORDS = 32  # what the learner is asked for; validation (core.domain.library) refuses only past MAX_WORDS


def shown_ids(text: str) -> list[str]:
    """The experience ids a learner prompt shows, in the `[E3] text` lines of render_for_learner."""
    return re.findall(r"^\[(E\d+)\] ", text, re.MULTILINE)


def _known_ids_only(text: str, known: Sequence[str]) -> str:
    """`text` with every E<number> the library shown lacks (a proposal naming an id, a rejected DELETE of an
    experience merged since) written as words, so the learner never reads an id it cannot use."""
    return EXPERIENCE_ID.sub(lambda m: m.group(0) if m.group(0) in known else "another experience", text)


def update_messages(experiences: list[dict], proposals: list[str], max_experiences: int,
                    max_operations: int = MAX_UPDATE_OPERATIONS,
                    rejected: Sequence[tuple[str, str]] = ()) -> list[dict]:
    """Step 4: consolidate the batch's proposals into operations on the current library, told which earlier
    operations were rejected and why (`rejected`: text and reason pairs, oldest first). Where an id goes the
    prompt shows ID_PLACEHOLDER, never an example id, and with an empty library it says that only ADD is possible."""
    library = render_for_learner(experiences)
    ids = shown_ids(library)
    proposal_lines = "\n".join(f"{i}. {_known_ids_only(text, ids)}" for i, text in enumerate(proposals, 1))
    if ids:
        operations = (
            "Update the library with operations:\n"
            '- ADD: a new experience (ids: [], text: the experience)\n'
            f'- MODIFY: revise one experience (ids: ["{ID_PLACEHOLDER}"], text: the revised experience)\n'
            f'- DELETE: remove experiences that are wrong or useless (ids: ["{ID_PLACEHOLDER}", ...], text: "")\n'
            f'- MERGE: combine overlapping experiences into one (ids: ["{ID_PLACEHOLDER}", "<the id of another '
            'one>", ...], text: the merged experience)\n'
            '- KEEP: nothing to change (ids: [], text: "")\n'
            "Usually each useful proposal becomes an ADD whose text is the proposal itself (revised to be general), "
            "or a MODIFY / MERGE when it overlaps an experience already in the library. "
            f"The only ids that exist are {', '.join(ids)}: never write any other.\n")
    else:
        operations = (
            "The library is empty, so there are no ids yet and only ADD is possible: each useful proposal becomes "
            "an ADD (ids: [], text: the proposal itself, revised to be general).\n")
    content = (
        f"Current experience library (ids in brackets):\n{library}\n\n"
        f"Proposed experiences from this batch:\n{proposal_lines}\n\n"
        f"{_known_ids_only(_rejected_block(rejected), ids)}"
        f"{operations}"
        f"Write each experience as one whole sentence of at most {LESSON_WORDS} words: a general lesson, with no "
        f"numbers, names or details of one problem. Avoid duplicates, and keep the library at most "
        f"{max_experiences} experiences. At most {max_operations} operations; a one-sentence rationale each.\n"
        'Reply with JSON only: {"operations": [{"op": "ADD", "ids": [], "text": "<experience>", '
        '"rationale": "<why>"}]}'
    )
    return _chat("You curate a small library of experiences for an AI agent.", content)


def retry_messages(messages: list[dict], problems: Sequence[tuple[str, str]]) -> list[dict]:
    """The same request asked again, its last message naming the texts of the first reply that cannot be used
    (`problems`: text and why, e.g. over the length limit), so the learner writes them whole and within the
    limit instead of the studio cutting them. Ids in the texts that the request does not show are left out."""
    known = EXPERIENCE_ID.findall(" ".join(str(m.get("content") or "") for m in messages))
    lines = "\n".join(f'- "{_known_ids_only(_clip(text, 400), known)}": {why}' for text, why in problems)
    note = (f"\n\nA first reply to this request wrote texts that cannot be used:\n{lines}\n"
            f"Write the whole reply again. Every text must be whole (never cut off) and short: one sentence of at "
            f"most {LESSON_WORDS} words for each experience.")
    *head, last = messages
    return [*head, {**last, "content": f"{last['content']}{note}"}]


def example_messages(query: str, trajectory: str) -> list[dict]:
    """A successful rollout compressed into a worked example (issue 26): the problem in brief, the steps that
    reached the answer, and the answer the rollout reached. The reference answer is not shown: the example's
    answer is scored with the task's reward afterwards, and an example that could copy the reference would
    pass that check whatever its steps say."""
    content = (
        f"An AI agent solved this problem correctly.\n\nProblem:\n{query}\n\n"
        f"The agent's solution:\n{trajectory}\n\n"
        "Write it as a worked example another agent can learn the method from: the problem in brief (keep "
        "the numbers it needs), the steps that reached the answer, each short and in order, and the final "
        "answer alone, exactly as the solution gave it. Leave out detours and checks that did "
        f"not change the answer. At most {EXAMPLE_MAX_WORDS} words in all.\n"
        'Reply with JSON only: {"problem": "...", "steps": ["...", "..."], "answer": "..."}'
    )
    return _chat("You turn a correct solution into a short worked example.", content)


def reference_reply_messages(instructions: str, answer_format: str, query: str, parts: Sequence[str],
                             max_words: int) -> list[dict]:
    """A worked example made from a reference answer (a group where every attempt failed, issue 36): the reply a
    person would send to the query, stating every part of the reference (`parts`, as
    core.domain.reference_answers.reference_parts writes them) in whole sentences, as the task's instructions
    and answer format ask. The reply is then scored with the task's reward like any example's answer; the
    reference's raw form ("7 years;LK-72886") taught the agent nothing it could say."""
    facts = "\n".join(f"- {part}" for part in parts)
    rules = "\n".join(text.strip() for text in (instructions, answer_format) if text.strip())
    content = (
        f"An agent works with these instructions:\n{rules}\n\nIt was sent this message:\n{query}\n\n"
        f"The right answer states these facts:\n{facts}\n\n"
        "Write the reply a person would send to the message, as the instructions ask: whole sentences that state "
        "every fact above, each number, name and code exactly as written there, and nothing about where the "
        f"facts came from. At most {max_words} words.\n"
        'Reply with JSON only: {"reply": "..."}'
    )
    return _chat("You write the reply a careful person would send.", content)


def direct_messages(instructions: str, queries: list[tuple[str, str | None]], count: int) -> list[dict]:
    """The paper's baseline: experiences written from the training queries alone, with no rollouts."""
    listing = "\n\n".join(
        f"Problem {i}: {q}" + (f"\nAnswer: {a}" if a else "") for i, (q, a) in enumerate(queries, 1)
    )
    content = (
        f"An AI agent has these instructions:\n{instructions}\n\nExample problems it will face:\n{listing}\n\n"
        f"Write {count} general, reusable experiences (lessons) that would help the agent solve such problems, "
        'each at most 32 words. Reply with JSON only: {"experiences": ["...", "..."]}'
    )
    return [{"role": "user", "content": content}]


SIMULATOR_CUE = "(The conversation starts. Write the user's messages.)"
END_MARKER = "[END]"  # the user simulator writes this when its need is met or it gives up


def simulator_system_prompt(persona: Persona, scenario: Scenario) -> str:
    """Who the simulator plays and when it stops. It says nothing about the agent's instructions or library:
    a simulator that knew them could steer the agent towards them and make the library look better than it is."""
    facts = "\n".join(f"- {fact}" for fact in persona.hidden_facts)
    hidden = (
        "Facts about you that you do not volunteer: reveal one only when the assistant asks about it clearly "
        f"and kindly, and never all at once:\n{facts}\n\n" if facts else ""
    )
    return (
        f"You play a user talking to an assistant. Stay in character for the whole conversation.\n\n"
        f"Who you are ({persona.name}):\n{persona.description.strip()}\n\n"
        f"{hidden}"
        f"Your situation: you opened the conversation with: {scenario.opening.strip()}\n"
        f"What you want from the conversation: {scenario.goal.strip()}\n\n"
        "Answer the assistant's last message in character, as one message of the user and nothing else: "
        "no stage directions, no notes about the role play. You are the user, never the assistant. "
        f"When your need is met, or you give up, end your message with {END_MARKER}."
    )


def simulator_messages(persona: Persona, scenario: Scenario, transcript: Sequence[dict]) -> list[dict]:
    """The user simulator's request: its role, then only the visible turns with the roles swapped (the
    agent's turns are `user` to it, its own are `assistant`). `transcript` holds turns as
    core.domain.conversation stores them (`role` from the agent's side, `text`)."""
    swapped = {"user": "assistant", "assistant": "user"}
    visible = [{"role": swapped[turn["role"]], "content": turn["text"]} for turn in transcript]
    # Several providers refuse a conversation whose first turn after the system prompt is the assistant's.
    lead = [{"role": "user", "content": SIMULATOR_CUE}] if visible and visible[0]["role"] == "assistant" else []
    return [{"role": "system", "content": simulator_system_prompt(persona, scenario)}, *lead, *visible]


def scenario_text(persona: Persona, scenario: Scenario) -> str:
    """A conversation's task as the judge and the learner read it: who the user was and what a good
    conversation achieves (the persona's hidden facts included: the judge checks whether they were found)."""
    facts = "; ".join(persona.hidden_facts)
    return (f"The agent talked with a user: {persona.name} (segment {persona.segment}). {persona.description.strip()}"
            + (f"\nFacts the agent had to find out: {facts}" if facts else "")
            + f"\nGoal of the conversation: {scenario.goal.strip()}")


def rubric_messages(situation: str, criteria: Sequence, transcript: str, fence: Fence) -> list[dict]:
    """The judge scores a whole conversation on each rubric criterion (core.domain.rubric.Criterion), on its scale;
    the transcript (core.domain.conversation.fenced_transcript) is inside `fence`."""
    lines = []
    for criterion in criteria:
        scale = "0 (no) or 1 (yes)" if criterion.scale == "binary" else "1 (poor) to 5 (excellent)"
        lines.append(f"- {criterion.name}: {criterion.description.strip() or criterion.name} Score {scale}.")
    system = ("You are a strict, fair grader of customer conversations. Score the agent (not the user) on every "
              "criterion, each on its own scale, from what the transcript shows. Reply with JSON only: "
              '{"criteria": {"<criterion name>": {"score": <integer>, "reason": "<one sentence>"}, ...}, '
              '"unsure": <true|false>}. Set unsure to true when the transcript does not settle a score. '
              + fence.rule)
    user = (f"{situation}\n\nCriteria:\n" + "\n".join(lines)
            + f"\n\nTranscript, one JSON object a turn:\n{fence.wrap(transcript)}")
    return _chat(system, user)


def rule_messages(situation: str, question: str, transcript: str, fence: Fence) -> list[dict]:
    """The judge answers one rule's yes/no question about a conversation (inside `fence`) and names the turn."""
    system = ("You check one rule about a conversation between an agent and a user. Answer the question from the "
              "transcript only: say true only if the transcript shows it, and quote the exact words that show it "
              "(asked whether the agent avoided something, say false only with a quote of the words that break "
              'it). Reply with JSON only: {"holds": <true|false>, "turn": <the number of the turn that '
              'shows it, or 0 if none>, "quote": "<the exact words from that turn, or empty>", '
              '"reason": "<one sentence>"}.')
    return _chat(system + " " + fence.rule, f"{situation}\n\nQuestion: {question.strip()}\n\nTranscript, one JSON "
                 f"object a turn:\n{fence.wrap(transcript)}")
