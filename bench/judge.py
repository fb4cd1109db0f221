"""The LLM judge on the customer-support demo: latency per verdict, share of usable verdicts, separation.

For each of N support messages the judge scores one hand-written good reply (empathetic, accurate,
with a next step) and one bad reply (curt, with an invented policy, no next step), through
`core.models.judge.judge_response`, the path a run uses. A fresh temporary SQLite file means no verdict
comes from the response cache, so every figure is a real model call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

JUDGE_MAX_TOKENS = 300  # the max_tokens core.models.judge asks for

# (good, bad) reply per support message id, in the order of data/demo/support_messages.jsonl.
REPLIES: dict[str, tuple[str, str]] = {
    "s01": ("I'm sorry about the double charge of $64.99 on March 3, especially when money is tight. The "
            "duplicate payment is refunded to your original payment method within 3-5 business days. If it has "
            "not arrived by then, reply here and I will escalate it to a team lead.",
            "Double charges happen. Per our billing policy a second charge is kept as a processing fee for 60 "
            "days. Check with your bank."),
    "s02": ("I'm really sorry: three days without internet while you work from home is hard, and losing pay makes "
            "it worse. The current repair estimate for Maple Heights is on status.lumen.example. I can add you to "
            "text updates so you hear the moment anything changes. Shall I do that?",
            "Outages happen and we are working on it. It will be fixed by tonight and you will get a free month "
            "for the trouble. Please stop shouting."),
    "s03": ("I'm sorry the Dial does not work with your heating system. Yes, you can return it: it was delivered "
            "on the 5th, so you are within the 30-day window, and the refund is in full. Reply to this message "
            "and I will send you the return instructions today.",
            "Thermostats cannot be returned once they have been opened, it says so in our terms. You should have "
            "checked compatibility first."),
    "s04": ("I understand, a broken thermostat with guests arriving next week is stressful. I don't have a "
            "delivery date yet, but I will check order LM-48213 with our shipping team now and, if it is stuck, "
            "escalate it to a team lead, who replies within one business day.",
            "Orders always ship within 14 days, so it will come next week. Nothing we can do until then."),
    "s05": ("Sorry for the trouble signing in. After five failed sign-ins an account is locked for 30 minutes, "
            "then it unlocks by itself. If you have forgotten your password, I can send a reset link to the email "
            "address on file. Would you like me to do that?",
            "Your account is locked for 48 hours for security. Give me your new email address and I will send a "
            "reset link there."),
    "s06": ("Thank you for writing, and please don't worry about asking. I can't say for sure what the blinking "
            "flame means, and because you are worried about safety I am passing this to a team lead right away; "
            "they will contact you within one business day. If you smell gas or smoke, leave the house and call "
            "emergency services.",
            "The flame icon just means the heating is on. It is normal, nothing to worry about. Read the manual."),
    "s07": ("Thanks for your interest in the Lumen Dial! I don't have confirmed details on weekday and weekend "
            "schedules, so I will check with the product team and get back to you. If you buy one and it does not "
            "suit you, you can return it within 30 days of delivery for a full refund.",
            "Yes, the Dial has seven separate day schedules and learns your habits automatically. Buy it now "
            "before the price goes up next week."),
    "s08": ("Good luck with the move to Portugal! There is no cancellation fee on monthly plans, and your "
            "service runs to the end of the month you have paid for. I will start the cancellation on account "
            "7790-115 now and send you a confirmation by email.",
            "Leaving early costs a $150 early termination fee. Call us to cancel, we cannot do it here."),
    "s09": ("Thank you so much for taking the time to tell us! I'm glad Priya explained everything and left things "
            "tidy. I will pass your kind words on to her and her team lead today.",
            "Noted. While you are here, have you seen our new Lumen Dial thermostat? It is 20% off this week only."),
    "s10": ("Sorry your internet is slow in the evening. That is not good. I can run a line check on your "
            "connection now. Then I will tell you what we find and what we can do next. Is that OK?",
            "Evening is busy, everyone is online. This is your problem, not ours. Maybe buy the more expensive "
            "plan."),
}


@dataclass
class Outcome:
    """One verdict: which reply, its value (None if unusable), seconds taken, judge doubt."""

    sample: str
    kind: str
    value: float | None
    seconds: float
    unsure: bool
    detail: str
    tokens: list[int]  # completion tokens of each model call behind the verdict (2 when asked again)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def calls_since(engine, last_id: int) -> list[tuple[int, int]]:
    """(id, completion tokens) of the judge's ledger rows after `last_id`."""
    from sqlmodel import Session, select

    from storage.tables import LLMCall

    with Session(engine) as session:
        rows = session.exec(select(LLMCall.id, LLMCall.tokens_out).where(LLMCall.stage == "judge", LLMCall.id > last_id)
                            .order_by(LLMCall.id)).all()
    return [(row[0], row[1]) for row in rows]


async def judge_all(engine, task, samples, warm_up: bool) -> list[Outcome]:
    """Judge each reply one at a time, so a latency is one verdict's, not a share of a batch."""
    from core.models.gateway import Gateway, Scope
    from core.models.judge import judge_response

    gateway = Gateway(engine, concurrency=1)
    if warm_up:
        await judge_response(gateway, task, samples[0], "Warm-up reply, not counted.", scope=Scope())
    last_id = max((i for i, _ in calls_since(engine, 0)), default=0)
    outcomes = []
    for sample in samples:
        for kind, reply in zip(("good", "bad"), REPLIES[sample.external_id], strict=True):
            started = time.perf_counter()
            verdict = await judge_response(gateway, task, sample, reply, scope=Scope())
            seconds = time.perf_counter() - started
            calls = calls_since(engine, last_id)
            last_id = max((i for i, _ in calls), default=last_id)
            outcomes.append(Outcome(sample.external_id, kind, verdict.value, seconds, verdict.unsure, verdict.detail,
                                    [tokens for _, tokens in calls]))
    return outcomes


def report(outcomes: list[Outcome], show: bool, limit: int = JUDGE_MAX_TOKENS) -> None:
    seconds = [o.seconds for o in outcomes]
    parsed = [o for o in outcomes if o.value is not None]
    tokens = [t for o in outcomes for t in o.tokens]
    print(f"verdicts {len(outcomes)}  model calls {len(tokens)} (an unusable reply is asked again)")
    print(f"completion tokens per call: median {statistics.median(tokens):.0f}  max {max(tokens)}  "
          f"calls cut at the {limit}-token limit: {sum(t >= limit for t in tokens)}")
    print(f"latency per verdict: median {statistics.median(seconds):.2f} s  p90 {percentile(seconds, 0.9):.2f} s  "
          f"max {max(seconds):.2f} s")
    print(f"parsed: {len(parsed)}/{len(outcomes)} ({len(parsed) / len(outcomes):.0%})  "
          f"unsure: {sum(o.unsure for o in outcomes)}/{len(outcomes)}")
    for kind in ("good", "bad"):
        values = [o.value for o in parsed if o.kind == kind]
        mean = f"{statistics.fmean(values):.3f}" if values else "n/a"
        print(f"mean value, {kind} replies: {mean}  (n={len(values)}; values {sorted(values)})")
    pairs = {}
    for o in parsed:
        pairs.setdefault(o.sample, {})[o.kind] = o.value
    both = [p for p in pairs.values() if len(p) == 2]
    above = sum(p["good"] > p["bad"] for p in both)
    ties = sum(p["good"] == p["bad"] for p in both)
    below = len(both) - above - ties
    print(f"pairs with both parsed: {len(both)}  good > bad: {above}  tie: {ties}  good < bad: {below}")
    if show:
        for o in outcomes:
            print(f"  {o.sample} {o.kind:4} {o.seconds:5.2f}s tokens {o.tokens} {o.detail[:150]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10, help=f"support messages (at most {len(REPLIES)})")
    parser.add_argument("--model", default=None, help="judge model (litellm name); default: the embedded model")
    parser.add_argument("--show", action="store_true", help="print every verdict's reason")
    args = parser.parse_args()
    if not 1 <= args.n <= len(REPLIES):
        parser.error(f"--n must be between 1 and {len(REPLIES)} (one canned pair per message)")

    from sqlmodel import Session, select

    from core.records.tasks.demos import SUPPORT_TASK, ensure_demo_tasks
    from core.records.tasks.lookup import get_task
    from core.settings import get_settings
    from storage.db import make_engine
    from storage.tables import Sample

    model = args.model or get_settings().model
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'bench.db'}")
        ensure_demo_tasks(engine)
        with Session(engine) as session:
            task = get_task(session, SUPPORT_TASK)
            ids = list(REPLIES)[: args.n]
            samples = sorted(session.exec(select(Sample).where(Sample.task_id == task.id,
                                                               Sample.external_id.in_(ids))).all(),
                             key=lambda s: ids.index(s.external_id))
            session.expunge_all()
        task.judge_model = model
        print(f"cpu_count {os.cpu_count()}  n_threads {get_settings().threads}  judge {model}  "
              f"scale {task.reward_settings['scale']}  messages {len(samples)} x (good, bad)")
        started = time.perf_counter()
        if model.startswith("local/"):
            from core.models import gateway  # noqa: F401  (importing the gateway registers local/...)
            from core.models.local_model import get_server

            get_server(model.removeprefix("local/"))
            print(f"model loaded in {time.perf_counter() - started:.1f}s")
        outcomes = asyncio.run(judge_all(engine, task, samples, warm_up=model.startswith("local/")))
        engine.dispose()
    print()
    report(outcomes, args.show)


if __name__ == "__main__":
    main()
