"""Every command of `python -m core`, declared once: its name, help, arguments, and the handler that runs it,
named by a dotted path ("core.cli.versions:cmd_export") and imported only when its command runs (a lazily
loaded command group, as click's LazyGroup, on argparse). Building the parser therefore imports no handler
module: `--help` and a usage mistake answer before any command's imports load (tests/test_cli_imports.py).

This module imports only what the declarations themselves need (choices, defaults shown in the help)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module

from core.cli.base import VERSION_HELP, Parser
from core.domain.datasets import SPLITS
from core.domain.roles import API_ROLES, PERSON_ROLES, ROLES
from core.domain.selection import SelectionMode
from core.domain.webhooks import EVENTS
from core.models.local_model import MODELS
from core.records.runs.settings import RunSettings
from storage.statuses import GateRule, OperationStatus

__all__ = ["add_commands", "load_handler"]


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Every command group, in the order `--help` lists them."""
    for add in (_tasks, _people, _model_connections, _jobs, _review, _model_server, _versions, _production,
                _deploy, _webhooks):
        add(sub)


def load_handler(path: str) -> Callable[[argparse.Namespace], int]:
    """The function "module:name" names, its module imported now (the first time its command runs)."""
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)


def _default(name: str) -> str:
    """A train option's help: the RunSettings field's description and default, so the two never disagree."""
    field = RunSettings.model_fields[name]
    default = field.get_default(call_default_factory=True)
    text = field.description or name.replace("_", " ")
    help_text = f"{text} (default {default})" if default not in (None, "") else text
    return help_text.replace("%", "%%")  # argparse formats help with %


SHOW = "show"  # `review RUN` is `review show RUN`
STEP_HELP = ("the step's place in the run, as `run N` counts steps: 1 is epoch 1 · batch 1, then on through "
             "the batches and epochs")


def _step_option(p: argparse.ArgumentParser, default_help: str) -> None:
    p.add_argument("--step", type=int, metavar="N", help=f"{STEP_HELP} (default: {default_help})")


def _tasks(sub: argparse._SubParsersAction) -> None:
    """The task commands: demo tasks, dataset files, task files, and a library's segment and entry selection."""
    sub.add_parser("demo", help="ensure the demo tasks exist and print their names").set_defaults(handler="core.cli.tasks:cmd_demo")

    dataset = sub.add_parser("dataset", help="add a dataset file to a task, or show a task's data")
    dsub = dataset.add_subparsers(dest="dataset_command", required=True, parser_class=Parser)
    p = dsub.add_parser("add", help="validate a .jsonl, .json or .csv file, then add its new rows to a task")
    p.add_argument("--task", required=True)
    p.add_argument("--map", action="append", default=[], metavar="TARGET=COLUMN",
                   help="which column holds id, query, reference, rubric (or criteria), split; meta=a,b lists "
                        "the columns kept as metadata (default: all unused columns)")
    p.add_argument("--split", choices=list(SPLITS), default="train", help="split of rows that name none")
    p.add_argument("--test-share", type=float, default=0.0, metavar="SHARE",
                   help="hold this share (0-1) of the rows that name no split out for test, chosen by a fixed "
                        "seed so the same file splits the same way (default 0)")
    p.add_argument("--validation-share", type=float, default=0.0, metavar="SHARE",
                   help="hold this share (0-1) of the rows that name no split out for validation (default 0)")
    p.add_argument("--test-personas", metavar="NAMES",
                   help="conversation tasks: comma-separated persona names whose scenarios go to test")
    p.add_argument("file", help="a dataset file; for a conversation task, scenarios (.json or .csv with persona, "
                   "opening, goal, must, must_not)")
    p.set_defaults(handler="core.cli.tasks:cmd_dataset_add")
    p = dsub.add_parser("show", help="count a task's samples per split")
    p.add_argument("--task", required=True)
    p.set_defaults(handler="core.cli.tasks:cmd_dataset_show")

    task = sub.add_parser("task", help="export a task (settings and data) to a file, or import one")
    tsub = task.add_subparsers(dest="task_command", required=True, parser_class=Parser)
    p = tsub.add_parser("export", help="write a task's settings and samples as one JSON file")
    p.add_argument("name")
    p.add_argument("--output", "-o")
    p.set_defaults(handler="core.cli.tasks:cmd_task_export")
    p = tsub.add_parser("import", help="create a task from an exported file (checked whole before writing)")
    p.add_argument("file")
    p.add_argument("--name", help="import under this name instead of the one in the file")
    p.set_defaults(handler="core.cli.tasks:cmd_task_import")
    p = tsub.add_parser("personas", help="replace a task's personas from a .json or .csv file, or --show them")
    p.add_argument("task")
    p.add_argument("file", nargs="?", help="personas: a JSON list, {\"personas\": [...]}, or CSV with columns "
                   "name, description, segment, hidden_facts (facts separated by ;)")
    p.add_argument("--show", action="store_true", help="print the task's personas as JSON")
    p.set_defaults(handler="core.cli.tasks:cmd_task_personas")
    p = tsub.add_parser("split-by-persona", help="hold whole personas out: their scenarios to test, the rest to train")
    p.add_argument("task")
    p.add_argument("--test", required=True, metavar="NAMES", help="comma-separated persona names")
    p.set_defaults(handler="core.cli.tasks:cmd_task_split_by_persona")

    library = sub.add_parser("library", help="bind a library to a persona segment (conversation tasks); show or set "
                             "its entry selection, the entries a query is shown, and what a version covers")
    lsub = library.add_subparsers(dest="library_command", required=True, parser_class=Parser)
    p = lsub.add_parser("bind", help="the library serves this segment in segment-routed evaluations; train it "
                        "with `train --library NAME` (it then trains on that segment's scenarios only)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", required=True)
    p.add_argument("--segment")
    p.add_argument("--unbind", action="store_true")
    p.set_defaults(handler="core.cli.tasks:cmd_library_bind")
    p = lsub.add_parser("selection", help="show or set which entries each query is shown: all, or the k most "
                        "similar to the query (top_k, BM25); frozen into each run and evaluation made after")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--mode", choices=list(SelectionMode))
    p.add_argument("--k", type=int, help="entries per query under top_k (1 to 30; default 3)")
    p.set_defaults(handler="core.cli.tasks:cmd_library_selection")
    p = lsub.add_parser("select", help="the entries a query is shown from a version (as the API's selection route)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--query", required=True)
    p.add_argument("--label", default="production")
    p.add_argument("--version", help="a version's number in the library (e.g. 3) or latest, instead of a label")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="core.cli.tasks:cmd_library_select")
    p = lsub.add_parser("coverage", help="which train references a version covers: an example that its selection "
                        "shows the reference's query and that states every fact of it (the Library page's figure)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--version", default="latest", help="a version's number in the library (e.g. 3), a label, or "
                   "latest (the default)")
    p.set_defaults(handler="core.cli.tasks:cmd_library_coverage")


def _people(sub: argparse._SubParsersAction) -> None:
    """The people commands: the labeling queue and the users who may sign in."""
    p = sub.add_parser("queue", help="show a task's labeling queue, labeller agreement and disputes")
    p.add_argument("--task", required=True)
    p.set_defaults(handler="core.cli.people:cmd_queue")

    user = sub.add_parser("user", help="add, list or change the people who may sign in")
    usub = user.add_subparsers(dest="user_command", required=True, parser_class=Parser)
    password_help = ("take the password from this environment variable; without it `user add` reads one line "
                     "from piped stdin, or asks twice on a terminal")
    p = usub.add_parser("add", help="add a user (the first one switches sign-in on)")
    p.add_argument("name", help="a user name; with --provider the email the provider verifies")
    p.add_argument("--role", choices=PERSON_ROLES, required=True,
                   help=f"{', '.join(ROLES)}; or none (may sign in, may do nothing)")
    p.add_argument("--password-env", metavar="VAR", help=password_help)
    p.add_argument("--provider", action="store_true",
                   help="a person who signs in through the OpenID Connect provider (no password): NAME is their email")
    p.set_defaults(handler="core.cli.people:cmd_user_add")
    usub.add_parser("list", help="list users: name, role, active, how they sign in").set_defaults(handler="core.cli.people:cmd_user_list")
    p = usub.add_parser("set", help="change a user's role, switch them on or off, or set a new password")
    p.add_argument("name")
    p.add_argument("--role", choices=PERSON_ROLES)
    p.add_argument("--active", choices=["yes", "no"])
    p.add_argument("--password-env", metavar="VAR", help="set the password from this environment variable")
    p.set_defaults(handler="core.cli.people:cmd_user_set")


def _model_connections(sub: argparse._SubParsersAction) -> None:
    """The model connections: where models are served (`<connection>/<model>` then names one)."""
    models = sub.add_parser("models", help="add, list, test or remove model connections (an OpenAI-compatible "
                            "server or a litellm provider; a model is then <connection>/<model>)")
    msub = models.add_subparsers(dest="models_command", required=True, parser_class=Parser)
    p = msub.add_parser("add", help="add a connection")
    p.add_argument("name", help="lower-case, e.g. my-vllm; models are then my-vllm/<model>")
    p.add_argument("--base-url", help="an OpenAI-compatible server's address, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--provider", help="instead of --base-url: a litellm provider (openai, anthropic, deepseek, ...)")
    p.add_argument("--key-env", metavar="VAR", help="the environment variable that holds the key (never the key)")
    p.add_argument("--params", help='default request parameters as JSON, e.g. \'{"temperature": 0.2}\'')
    p.set_defaults(handler="core.cli.models:cmd_models_add")
    p = msub.add_parser("list", help="the connections, with whether each key variable is set here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="core.cli.models:cmd_models_list")
    p = msub.add_parser("test", help="one short call through a connection: the latency and the reply, or the error")
    p.add_argument("name")
    p.add_argument("--model", required=True, help="the model name the server or provider knows")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(handler="core.cli.models:cmd_models_test")
    p = msub.add_parser("remove", help="remove a connection")
    p.add_argument("name")
    p.set_defaults(handler="core.cli.models:cmd_models_remove")


def _jobs(sub: argparse._SubParsersAction) -> None:
    """The job commands: train, evaluate, compare, measure experiences, and the worker."""
    p = sub.add_parser("train", help="learn an experience library (or resume a run)")
    p.add_argument("--task")
    p.add_argument("--library", default="default")
    p.add_argument("--epochs", type=int, help=_default("epochs"))
    p.add_argument("--batch-size", type=int, help=_default("batch_size"))
    p.add_argument("--group-size", type=int, help=_default("group_size"))
    p.add_argument("--temperature", type=float, help=_default("temperature"))
    p.add_argument("--limit", type=int, help=_default("limit"))
    p.add_argument("--model", help="policy model (litellm string); default: the task's")
    p.add_argument("--learner-model", help="learner model for summaries, advantages, updates")
    p.add_argument("--no-ground-truth", action="store_true", help="learner sees no reward or reference")
    p.add_argument("--direct", action="store_true", help="baseline: experiences asked for directly, no rollouts")
    p.add_argument("--review", choices=["auto", "manual"], help=_default("review_mode"))
    p.add_argument("--hold-flagged", choices=["on", "off"], help="in auto review, operations with a quality flag "
                   "(cut off, near-duplicate, a query's numbers, too long) are refused before the validation gate "
                   "(invalid, the flag as the reason); off: measured and approved like the others; default: on")
    p.add_argument("--seed", type=int, help=_default("seed"))
    p.add_argument("--max-turns", type=int, help=_default("max_turns"))
    p.add_argument("--concurrency", type=int, help=_default("concurrency"))
    p.add_argument("--max-experiences", type=int, help=_default("max_experiences"))
    chosen = ("; default: chosen for the learner (on for the embedded one, off for others, as measured: "
              "`train` prints what it chose and why)")
    p.add_argument("--examples", action=argparse.BooleanOptionalAction, help="propose worked examples: a "
                   "successful attempt of a group where others failed (or the reference where all failed), "
                   "compressed by the learner and proposed only if its own answer scores as right against the "
                   "reference (tasks whose reward is computed from the answer)" + chosen)
    p.add_argument("--max-examples", type=int, help=_default("max_examples"))
    p.add_argument("--lessons", action=argparse.BooleanOptionalAction, help="propose lessons from each group's "
                   "semantic advantage (the paper); --no-lessons learns worked examples only" +
                   chosen.replace("on for the embedded one, off for others", "off for the embedded one, on for others"))
    p.add_argument("--reference-when-all-fail", action=argparse.BooleanOptionalAction, help="a group in which "
                   "every attempt failed goes to the learner with the reference answer as the successful side, "
                   "instead of being skipped (the paper skips it)" + chosen)
    p.add_argument("--learner-replies", action=argparse.BooleanOptionalAction, help="the learner writes the "
                   "reply of a worked example made from a reference (checked; a sentence per fact where it fails); "
                   "--no-learner-replies: the sentence per fact, no call, and on a task whose reward reads stated "
                   "facts a group with a right attempt also gets its example from the reference" +
                   chosen.replace("on for the embedded one, off for others", "off for the embedded one, on for others"))
    p.add_argument("--skip-covered", action=argparse.BooleanOptionalAction, help="with lessons off, a training "
                   "query is not rolled out again where an example shown to it states its reference, or where an "
                   "example stating it was rejected earlier in the run; default: on")
    p.add_argument("--max-tokens", type=int, help=_default("max_tokens") + ": the agent's reply")
    p.add_argument("--learner-max-tokens", type=int, help=_default("learner_max_tokens"))
    p.add_argument("--max-operations", type=int, help=_default("max_operations"))
    p.add_argument("--gate", choices=[rule.value for rule in GateRule], help=_default("gate"))
    p.add_argument("--validation-size", type=int, help=_default("validation_size"))
    p.add_argument("--gate-k", type=int, help=_default("gate_k"))
    p.add_argument("--budget", type=float, help=_default("budget_usd"))
    p.add_argument("--api-base", help="base URL for an OpenAI-compatible server")
    p.add_argument("--call-timeout", type=float, metavar="S", help=_default("call_timeout_s"))
    p.add_argument("--deadline", type=float, metavar="S", help=_default("call_deadline_s"))
    p.add_argument("--start-label", help=_default("start_label"))
    p.add_argument("--old-share", type=float, help=_default("old_share"))
    p.add_argument("--from-production", action="store_true", help="an update from production: start at the "
                   "production version, train on the harvested traces plus --old-share (default 0.3) of the old "
                   "train split, every change waiting for review (--review manual) unless --review says otherwise; "
                   "with --queue a worker runs it, the Production page's Update from production")
    p.add_argument("--resume", type=int, metavar="RUN", help="resume a stopped run")
    p.add_argument("--queue", action="store_true", help="only queue the run; a worker executes it")
    p.set_defaults(handler="core.cli.jobs:cmd_train")

    p = sub.add_parser("eval", help="evaluate a library version on a split (exit 1 while rollouts have errors)")
    p.add_argument("--task")
    p.add_argument("--version", help=VERSION_HELP + ", or empty")
    p.add_argument("--library", default="default", help="the library whose version --version names")
    job = p.add_mutually_exclusive_group()
    job.add_argument("--retry", type=int, metavar="ID", help="run again only the rollouts of evaluation ID that have "
                     "no reward (failed model calls), or continue a cancelled one; answered ones are not paid again")
    job.add_argument("--cancel", type=int, metavar="ID", help="stop evaluation ID (queued, running, stalled or "
                     "waiting for labels): a worker executing it stops within seconds; answered rollouts stay")
    p.add_argument("--split", default="test")
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--limit", type=int)
    p.add_argument("--model")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--json", action="store_true")
    p.add_argument("--queue", action="store_true", help="only queue the evaluation; a worker executes it")
    p.add_argument("--route-segments", action="store_true", help="conversation tasks: play each scenario with the "
                   "library bound to its persona's segment (its production version, else its newest), the given "
                   "version for the rest")
    p.set_defaults(handler="core.cli.jobs:cmd_eval")

    p = sub.add_parser("compare", help="is B better than A? a paired comparison on the same queries")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default", help="the library whose versions A and B name")
    p.add_argument("a", help=VERSION_HELP + ", empty, or an evaluation as e12")
    p.add_argument("b", help="the same kinds of reference as A")
    p.add_argument("--split", default="test")
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--limit", type=int)
    p.add_argument("--model", help="compare evaluations made on this model (evaluate on it where one is missing); "
                   "default: the newest finished pair made on one model, else the model of the task's newest "
                   "evaluation or run a person chose")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler="core.cli.jobs:cmd_compare")

    p = sub.add_parser("attribute", help="measure each experience of a version: the version against it without "
                       "each one, on the same queries")
    p.add_argument("--task")
    p.add_argument("--version", help=VERSION_HELP)
    p.add_argument("--library", default="default")
    p.add_argument("--split", help="split of the queries (default: validation if the task has one, else test)")
    p.add_argument("--k", type=int, default=2, help="samples per query for every variant (default 2)")
    p.add_argument("--limit", type=int, help="use only the first N queries of the split")
    p.add_argument("--concurrency", type=int, help=_default("concurrency"))
    p.add_argument("--budget", type=float, help=_default("budget_usd"))
    job = p.add_mutually_exclusive_group()
    job.add_argument("--resume", type=int, metavar="RUN", help="continue a stopped measurement")
    job.add_argument("--cancel", type=int, metavar="RUN", help="stop measurement run RUN for good: a worker "
                     "executing it stops within seconds; finished variants stay")
    p.add_argument("--queue", action="store_true", help="only queue the measurement; a worker executes it")
    p.add_argument("--json", action="store_true", help="print the effects as a JSON list")
    p.set_defaults(handler="core.cli.jobs:cmd_attribute")

    p = sub.add_parser("worker", help="execute queued runs and evaluations until stopped (Ctrl-C, SIGTERM)")
    p.add_argument("--once", action="store_true", help="stop when the queue is empty")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at an empty queue")
    p.set_defaults(handler="core.cli.worker:cmd_worker")


def _review(sub: argparse._SubParsersAction) -> None:
    """`review RUN` lists what waits; `review approve|reject|edit|reopen OP`, `approve-all|reject-all|apply RUN`
    decide."""
    review = sub.add_parser(
        "review", implied=SHOW, help="list what waits for review in a run, and decide it",
        usage="python -m core review RUN [--step N] [--json]\n"
              "       python -m core review {approve,reject,edit,reopen} OP ...\n"
              "       python -m core review {approve-all,reject-all,apply} RUN [--step N]",
        description="What waits for review in a run's steps, and the decisions on it (the Review page's rules: "
                    "approving or editing against a failed validation gate needs --note). After the last "
                    "decision of a step it says what happened: applied as a version, queued to measure the "
                    f"decided library first, or still waiting. --step N: {STEP_HELP}.")
    rsub = review.add_subparsers(dest="action", required=True, parser_class=Parser, prog="python -m core review")

    p = rsub.add_parser(SHOW, help="each operation of the steps that wait (id, kind, text, targets, flags, "
                        "evidence, status) under its step's gate line; `review RUN` is the same")
    p.add_argument("run_id", type=int, metavar="RUN")
    _step_option(p, "every step that waits for review")
    p.add_argument("--json", action="store_true", help="the same as one JSON object, full texts, for scripts")
    p.set_defaults(handler="core.cli.review:cmd_show")

    p = rsub.add_parser("approve", help="approve operations by id")
    p.add_argument("ops", type=int, nargs="+", metavar="OP")
    p.add_argument("--note", help="why, where the step's validation gate failed (required there)")
    p.set_defaults(handler="core.cli.review:cmd_decide", decision=OperationStatus.APPROVED)

    p = rsub.add_parser("reject", help="reject operations by id")
    p.add_argument("ops", type=int, nargs="+", metavar="OP")
    p.add_argument("--reason", help="stored with the decision and told to the learner in the run's later steps")
    p.set_defaults(handler="core.cli.review:cmd_decide", decision=OperationStatus.REJECTED)

    p = rsub.add_parser("edit", help="replace an operation's text or targets, checked as the learner's are; "
                        "counts as its decision")
    p.add_argument("op", type=int, metavar="OP")
    p.add_argument("--text", help="the new text (default: the proposed one)")
    p.add_argument("--targets", metavar="E1,E2", help="the ids it changes (default: the proposed ones)")
    p.add_argument("--note", help="why, where the step's validation gate failed (required there)")
    p.set_defaults(handler="core.cli.review:cmd_edit")

    p = rsub.add_parser("reopen", help="take a decision back while its step is not applied")
    p.add_argument("op", type=int, metavar="OP")
    p.set_defaults(handler="core.cli.review:cmd_reopen")

    for what, decision in (("approve", OperationStatus.APPROVED), ("reject", OperationStatus.REJECTED)):
        p = rsub.add_parser(f"{what}-all", help=f"{what} every pending operation of a step")
        p.add_argument("run_id", type=int, metavar="RUN")
        _step_option(p, "the run's only step that waits for review")
        if decision == OperationStatus.APPROVED:
            p.add_argument("--note", help="why, where the step's validation gate failed (required there)")
        else:
            p.add_argument("--reason", help="stored with each decision and told to the learner later")
        p.set_defaults(handler="core.cli.review:cmd_decide_step", decision=decision)

    p = rsub.add_parser("apply", help="apply a step whose operations are all decided but which was not applied")
    p.add_argument("run_id", type=int, metavar="RUN")
    _step_option(p, "the run's only step that waits for review")
    p.set_defaults(handler="core.cli.review:cmd_apply")


def _model_server(sub: argparse._SubParsersAction) -> None:
    """The embedded model's server: one supervised process per model that every process of this machine calls."""
    p = sub.add_parser("model-server", help="run the embedded model as a supervised local server that every "
                       "process of this machine calls (one per model; `make run` starts it)")
    p.add_argument("--model", default=None, help="embedded model name (default: the studio's model if embedded, "
                   f"else {next(iter(MODELS))})")
    p.add_argument("--slots", type=int, help="requests served at once (default TFGRPO_LOCAL_SLOTS)")
    p.add_argument("--idle-exit", type=float, metavar="S", help="stop after S seconds unused (servers a process "
                   "started for itself)")
    p.add_argument("--stall", type=float, metavar="S", help="restart the server after S seconds of waiting "
                   "requests without a token (default TFGRPO_MODEL_STALL_S)")
    p.add_argument("--stop", action="store_true", help="stop the model's running server (for instance to start "
                   "it again with other TFGRPO_THREADS or slots)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler="core.cli.model_server:cmd_model_server")


def _versions(sub: argparse._SubParsersAction) -> None:
    """The version commands: export, import, list runs and versions, label and promote."""
    p = sub.add_parser("export", help="print a version as Markdown, JSON or a system-prompt block")
    p.add_argument("--task", required=True)
    p.add_argument("--version", required=True, help=VERSION_HELP + ", or empty")
    p.add_argument("--library", default="default")
    p.add_argument("--format", choices=["md", "json", "prompt"], default="md")
    p.add_argument("--output", "-o")
    p.add_argument("--route-segments", action="store_true", help="conversation tasks: one JSON file with this "
                   "version as the default and, per segment with a bound library, the version that serves it")
    p.set_defaults(handler="core.cli.versions:cmd_export")

    p = sub.add_parser("import", help="create a new version from a JSON or Markdown file")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("file")
    p.set_defaults(handler="core.cli.versions:cmd_import")

    p = sub.add_parser("runs", help="list runs")
    p.add_argument("--task")
    p.set_defaults(handler="core.cli.versions:cmd_runs")

    p = sub.add_parser("run", help="show one run: counters, failed groups, rejected operations, its version and "
                       "what it waits for (with the command that moves it on); or pause, resume or cancel it")
    p.add_argument("run_id", type=int)
    control = p.add_mutually_exclusive_group()
    for flag, what in (("pause", "a queued run waits, a running one stops at its next progress tick"),
                       ("resume", "queue a paused, failed or stalled run again for a worker (train --resume RUN "
                                  "continues it in this process instead)"),
                       ("cancel", "end the run for good; the versions it created stay")):
        control.add_argument(f"--{flag}", dest="control", action="store_const", const=flag, help=what)
    p.set_defaults(handler="core.cli.versions:cmd_run")

    p = sub.add_parser("versions", help="list the library versions of a task")
    p.add_argument("--task", required=True)
    p.add_argument("--library")
    p.set_defaults(handler="core.cli.versions:cmd_versions")

    p = sub.add_parser("label", help="point a label (e.g. production) at a version")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--version", required=True, help=VERSION_HELP)
    p.add_argument("name")
    p.add_argument("--reason", help="production only: why it moves without a paired comparison with the current "
                   "production version (or although the comparison finds it worse); stored in the audit log")
    p.set_defaults(handler="core.cli.versions:cmd_label")

    p = sub.add_parser("promote", help="move production to a version: shows the diff and the paired comparison "
                       "with production first")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--version", required=True, help=VERSION_HELP)
    p.add_argument("--reason", help="why it moves without a paired comparison (or although the comparison finds "
                   "it worse); stored in the audit log")
    p.add_argument("--dry-run", action="store_true", help="only show the diff and the comparison; move nothing")
    p.set_defaults(handler="core.cli.versions:cmd_promote")


def _production(sub: argparse._SubParsersAction) -> None:
    """The production commands under `python -m core`."""
    p = sub.add_parser("serve", help="serve the HTTP API (python -m api) on its own port")
    p.add_argument("--host", default="127.0.0.1", help="loopback unless sign-in is on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="default TFGRPO_API_PORT or 8502")
    p.set_defaults(handler="core.cli.production:cmd_serve")

    apikey = sub.add_parser("apikey", help="create, list or revoke the API keys live agents use")
    asub = apikey.add_subparsers(dest="apikey_command", required=True, parser_class=Parser)
    p = asub.add_parser("create", help="make a key; it is printed once and stored hashed")
    p.add_argument("--name", required=True, help="which agent uses it")
    p.add_argument("--role", choices=list(API_ROLES), required=True,
                   help="; ".join(f"{role}: {what}" for role, what in API_ROLES.items()))
    p.add_argument("--person", metavar="USER", help="the user the key acts for: it carries at most their role "
                                                     "(a read key needs a labeler, an ingest key a reviewer)")
    p.add_argument("--task", help="an ingest key's task: every trace and span it sends is stored there, and one "
                                  "naming another task is refused")
    p.add_argument("--library", help="with --task: the library of that task it writes to")
    p.add_argument("--any-task", action="store_true", help="an ingest key that may write to any task (what a "
                                                           "trace or span names, or the service map, decides)")
    p.set_defaults(handler="core.cli.production:cmd_apikey_create")
    asub.add_parser("list", help="every key: name, role, prefix, last use, revoked").set_defaults(
        handler="core.cli.production:cmd_apikey_list")
    p = asub.add_parser("revoke", help="revoke a key for good")
    p.add_argument("id", type=int)
    p.set_defaults(handler="core.cli.production:cmd_apikey_revoke")

    p = sub.add_parser("traces", help="production traces of a task: per day and version, and the lowest scored; "
                                      "OpenTelemetry services mapped to tasks and spans held for them")
    p.add_argument("--task", help="the task (required unless a subcommand is given)")
    p.add_argument("--since", help="a date such as 2026-11-01")
    p.add_argument("--max-score", type=float)
    p.add_argument("--lowest", type=int, default=5)
    p.set_defaults(handler="core.cli.production:cmd_traces")
    tsub = p.add_subparsers(dest="traces_command", required=False, parser_class=Parser)
    q = tsub.add_parser("map-service", help="store an OpenTelemetry service's spans under a task from now on; the "
                                            "spans held for it land there")
    q.add_argument("--service", required=True, help="its resource's service.name")
    q.add_argument("--task", dest="map_task", metavar="TASK", required=True)
    q.add_argument("--library", default="default")
    q.set_defaults(handler="core.cli.production:cmd_map_service")
    tsub.add_parser("held", help="OpenTelemetry spans held per service (not mapped yet, or unreadable), and "
                                 "those dropped past the bound").set_defaults(handler="core.cli.production:cmd_held")

    p = sub.add_parser("production-rules", help="which production traces go to the labelling queue")
    p.add_argument("--task", required=True)
    p.add_argument("--below", type=float, help="every trace scored under this")
    p.add_argument("--share", type=float, help="and this fraction of the rest")
    p.add_argument("--judge-share", type=float, help="the task's own reward (its judge) scores this fraction of "
                                                     "traces received from now on, in the worker")
    p.add_argument("--judge-ab", action="store_true", help="and every trace without feedback an A/B arm served")
    p.set_defaults(handler="core.cli.production:cmd_production_rules")

    p = sub.add_parser("ab", help="serve a candidate label to a share of users beside production, or show the "
                       "A/B experiment's verdict (--status)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("label", nargs="?", help="the label whose version the candidate's users are served (e.g. "
                   "candidate); the rest are served production")
    p.add_argument("--share", type=float, default=0.1, help="the fraction of user ids served the label, 0.05 to "
                   "0.95 (default 0.1); each user keeps their arm")
    p.add_argument("--off", action="store_true", help="end the split: everyone gets production")
    p.add_argument("--status", action="store_true", help="each arm's version, users, scored traces and mean per "
                   "user, the difference with its anytime-valid interval (each user counted once) and whether it "
                   "is decided (what the Production page shows)")
    p.add_argument("--json", action="store_true", help="with --status: as JSON (difference, low, high, decided, ...)")
    p.add_argument("--effect", type=float, default=0.05, help="with --status: the difference to plan for: how "
                   "many more users with a scored trace it needs at the current rate (default 0.05)")
    p.set_defaults(handler="core.cli.production:cmd_ab")

    p = sub.add_parser("harvest", help="turn production traces into train samples (deduplicated)")
    p.add_argument("--task", required=True)
    p.add_argument("--since", help="only traces from this date, e.g. 2026-11-01")
    p.add_argument("--max-score", type=float, help="only traces scored at most this")
    p.add_argument("--labelled-only", action="store_true", help="only traces a person labelled")
    p.set_defaults(handler="core.cli.production:cmd_harvest")


def _deploy(sub: argparse._SubParsersAction) -> None:
    """The deploy commands."""
    p = sub.add_parser("migrate", help="bring the database's schema to the newest revision (a deploy step; "
                                       "TFGRPO_MIGRATE_ON_START=0 stops processes from doing it on start)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if the database is behind")
    p.set_defaults(handler="core.cli.deploy:cmd_migrate")


def _webhooks(sub: argparse._SubParsersAction) -> None:
    """The webhook commands."""
    webhook = sub.add_parser("webhook", help="notify a team's tools when a person is needed (Standard Webhooks)")
    wsub = webhook.add_subparsers(dest="webhook_command", required=True, parser_class=Parser)
    p = wsub.add_parser("add", help="add a receiver; prints its signing secret once",
                        epilog="events: " + "; ".join(f"{name}: {line}" for name, line in EVENTS.items()))
    p.add_argument("name", help="a name for it, e.g. team-chat")
    p.add_argument("url", help="http(s) URL the events are posted to (a chat tool's incoming webhook works)")
    p.add_argument("--events", help="comma-separated events it hears (default: all)")
    p.add_argument("--secret-env", help="read the whsec_ signing secret from this environment variable instead of "
                                        "storing a new one")
    p.set_defaults(handler="core.cli.webhooks:cmd_add")
    wsub.add_parser("list", help="the receivers: name, host, events (never the secret)").set_defaults(handler="core.cli.webhooks:cmd_list")
    p = wsub.add_parser("remove", help="remove a receiver and its delivery log")
    p.add_argument("name")
    p.set_defaults(handler="core.cli.webhooks:cmd_remove")
    p = wsub.add_parser("test", help="send a signed test message now and say what the receiver answered")
    p.add_argument("name")
    p.set_defaults(handler="core.cli.webhooks:cmd_test")
    p = wsub.add_parser("replay", help="queue a logged delivery again (same webhook-id)")
    p.add_argument("delivery", type=int, help="the delivery's id in `webhook deliveries`")
    p.set_defaults(handler="core.cli.webhooks:cmd_replay")
    p = wsub.add_parser("deliveries", help="the delivery log: status, response code, attempts")
    p.add_argument("--name", help="of this receiver only")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(handler="core.cli.webhooks:cmd_deliveries")
    p = wsub.add_parser("deliver", help="one delivery pass now (a worker does this every few seconds)")
    p.add_argument("--now", action="store_true", help="send every waiting delivery now, whatever its back-off (a "
                   "receiver known to be back)")
    p.add_argument("name", nargs="?", help="with --now: of this receiver only")
    p.set_defaults(handler="core.cli.webhooks:cmd_deliver")
    secrets_group = sub.add_parser("secrets", help="the key that seals stored secrets (webhook signing secrets)")
    ssub = secrets_group.add_subparsers(dest="secrets_command", required=True, parser_class=Parser)
    ssub.add_parser("rotate", help="seal every stored secret again under a new key (the key file's: made now; "
                    "TFGRPO_SECRET_KEY's: set it to `new,old` first)").set_defaults(handler="core.cli.webhooks:cmd_rotate")
