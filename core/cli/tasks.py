"""The task commands: the demo tasks, a task's dataset files, task files and personas, and a library's segment
and entry selection."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.cli.base import Parser, UsageError, engine_of, name_list, read_file, write_output
from core.domain.datasets import SPLITS, check_size, mapping_note, parse_mapping, resolve_columns
from core.domain.personas import check_file_size as check_persona_file_size
from core.domain.personas import parse_personas, persona_dicts
from core.domain.selection import SelectionMode


def cmd_demo(args: argparse.Namespace) -> int:
    from core.records.tasks import ensure_demo_tasks

    for task in ensure_demo_tasks(engine_of(args)):
        print(task.name)
    return 0


def cmd_dataset_add(args: argparse.Namespace) -> int:
    """Columns nobody mapped are taken by core's rule (datasets.resolve_columns, applied by add_dataset_file),
    and said when renamed; the note reads the columns the way the Tasks page does (columns_of). After the
    counts come core's notes, the rows left out as duplicates, as the Tasks page shows them."""
    from sqlmodel import Session

    from core.records.scenarios import add_scenarios, is_conversation
    from core.records.task_io import columns_of
    from core.records.tasks import add_dataset_file, get_task

    path = Path(args.file)
    data = read_file(path, check_size)
    engine = engine_of(args)
    with Session(engine) as session:
        conversation = is_conversation(get_task(session, args.task))
    if conversation:  # a conversation task's samples are scenarios, checked against its personas
        held = name_list(args.test_personas)
        added, already = add_scenarios(engine, args.task, data, path.name, test_personas=held,
                                       default_split=args.split, actor="cli")
        print(f"added {added} scenarios to {args.task} ({already} already present)"
              + (f"; personas held out for test: {', '.join(held)}" if held else ""))
        return 0
    if args.test_personas:
        raise UsageError(f"dataset add: --test-personas is for conversation tasks; {args.task!r} is not one")
    explicit = parse_mapping(args.map)
    result = add_dataset_file(engine, args.task, data, path.name, mapping=explicit, default_split=args.split,
                              actor="cli", test_share=args.test_share, validation_share=args.validation_share)
    resolved = resolve_columns(columns_of(data, path.name), explicit)
    note = mapping_note({target: column for target, column in resolved.items() if target not in explicit})
    if note:
        print(note)
    print(f"added {result.added} samples to {args.task} ({result.already} already present)")
    for line in result.notes:
        print(line)
    return 0


def cmd_dataset_show(args: argparse.Namespace) -> int:
    from sqlmodel import Session

    from core.records.tasks import get_task
    from storage import queries

    with Session(engine_of(args)) as session:
        task = get_task(session, args.task)
        counts = queries.count_samples(session, task.id)
    print(f"{task.name}: {sum(counts.values())} samples")
    for split in sorted(counts):
        print(f"  {split:<6}{counts[split]:>6}")
    return 0


def cmd_task_export(args: argparse.Namespace) -> int:
    from sqlmodel import Session

    from core.records.task_io import export_task_json
    from core.records.tasks import get_task

    with Session(engine_of(args)) as session:
        text = export_task_json(session, get_task(session, args.name))
    write_output(args.output, text, end="\n")
    return 0


def cmd_task_import(args: argparse.Namespace) -> int:
    from core.records.task_io import import_task

    path = Path(args.file)
    data = read_file(path, check_size)
    task = import_task(engine_of(args), data, "cli", rename=args.name)
    print(f"imported task {task.name!r}")
    return 0


def cmd_task_personas(args: argparse.Namespace) -> int:
    """Replace a task's personas from a file, or print them (--show) as JSON that can be edited and loaded
    back; one or the other, so a forgotten file name never silently shows instead of saving."""
    from sqlmodel import Session

    from core.records.task_io import save_personas, task_personas
    from core.records.tasks import get_task

    if bool(args.file) == bool(args.show):
        raise UsageError("task personas: give a .json or .csv FILE to replace the personas, or --show")
    engine = engine_of(args)
    if args.show:
        with Session(engine) as session:
            task = get_task(session, args.task)
            personas = task_personas(session, task.id)
        sys.stdout.write(json.dumps({"personas": persona_dicts(personas)}, ensure_ascii=False, indent=2) + "\n")
        return 0
    path = Path(args.file)
    personas = parse_personas(read_file(path, check_persona_file_size), path.name)
    count = save_personas(engine, args.task, personas, "cli")
    print(f"{args.task}: {count} personas")
    return 0


def cmd_task_split_by_persona(args: argparse.Namespace) -> int:
    """Hold out whole personas: their scenarios go to test, every other scenario to train."""
    from core.records.scenarios import split_by_persona

    names = name_list(args.test)
    counts = split_by_persona(engine_of(args), args.task, names)
    print(f"{args.task}: " + ", ".join(f"{split} {count}" for split, count in sorted(counts.items())))
    return 0


def cmd_library_bind(args: argparse.Namespace) -> int:
    """Bind a library to a persona segment (or unbind it): segment-routed evaluations use it for that segment."""
    from core.records.segments import bind_library

    if bool(args.segment) == bool(args.unbind):
        raise UsageError("library bind: give --segment SEGMENT or --unbind")
    library = bind_library(engine_of(args), args.task, args.library, None if args.unbind else args.segment)
    print(f"library {library.name!r} of {args.task}: " + (f"serves segment {library.segment}" if library.segment
                                                            else "serves no segment"))
    return 0


def cmd_library_selection(args: argparse.Namespace) -> int:
    """Show the library's entry selection, or set it (`--mode all|top_k`, `--k N`; audited)."""
    from core.records.selection import library_selection, set_selection

    engine = engine_of(args)
    if args.mode is None and args.k is None:
        selection = library_selection(engine, args.task, args.library)
    else:
        selection = set_selection(engine, args.task, args.library, args.mode or library_selection(
            engine, args.task, args.library).mode, args.k, "cli")
    print(f"library {args.library!r} of {args.task}: selection {selection.mode} (k={selection.k}): "
          f"{selection.describe()}")
    return 0


def cmd_library_select(args: argparse.Namespace) -> int:
    """The entries a query would be shown from a version (the HTTP API's selection route, from the terminal)."""
    from sqlmodel import Session

    from core.records.serving import served_selection

    with Session(engine_of(args)) as session:
        served = served_selection(session, args.task, args.library, query=args.query,
                                  label=None if args.version else args.label, version=args.version)
    if args.json:
        print(json.dumps(served.as_dict(), ensure_ascii=False))
        return 0
    print(f"version #{served.number}, selection {served.selection['mode']} "
          f"(k={served.selection['k']}): {len(served.entries)} entries")
    for entry in served.entries:
        score = "" if entry["score"] is None else f"{entry['score']:>8.3f}  "
        print(f"{entry['id']:<6}{score}{entry['text']}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The task commands: demo tasks, dataset files, task files, and a library's segment and entry selection."""
    sub.add_parser("demo", help="ensure the demo tasks exist and print their names").set_defaults(func=cmd_demo)

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
    p.set_defaults(func=cmd_dataset_add)
    p = dsub.add_parser("show", help="count a task's samples per split")
    p.add_argument("--task", required=True)
    p.set_defaults(func=cmd_dataset_show)

    task = sub.add_parser("task", help="export a task (settings and data) to a file, or import one")
    tsub = task.add_subparsers(dest="task_command", required=True, parser_class=Parser)
    p = tsub.add_parser("export", help="write a task's settings and samples as one JSON file")
    p.add_argument("name")
    p.add_argument("--output", "-o")
    p.set_defaults(func=cmd_task_export)
    p = tsub.add_parser("import", help="create a task from an exported file (checked whole before writing)")
    p.add_argument("file")
    p.add_argument("--name", help="import under this name instead of the one in the file")
    p.set_defaults(func=cmd_task_import)
    p = tsub.add_parser("personas", help="replace a task's personas from a .json or .csv file, or --show them")
    p.add_argument("task")
    p.add_argument("file", nargs="?", help="personas: a JSON list, {\"personas\": [...]}, or CSV with columns "
                   "name, description, segment, hidden_facts (facts separated by ;)")
    p.add_argument("--show", action="store_true", help="print the task's personas as JSON")
    p.set_defaults(func=cmd_task_personas)
    p = tsub.add_parser("split-by-persona", help="hold whole personas out: their scenarios to test, the rest to train")
    p.add_argument("task")
    p.add_argument("--test", required=True, metavar="NAMES", help="comma-separated persona names")
    p.set_defaults(func=cmd_task_split_by_persona)

    library = sub.add_parser("library", help="bind a library to a persona segment (conversation tasks); show or set "
                             "its entry selection, and the entries a query is shown")
    lsub = library.add_subparsers(dest="library_command", required=True, parser_class=Parser)
    p = lsub.add_parser("bind", help="the library serves this segment in segment-routed evaluations; train it "
                        "with `train --library NAME` (it then trains on that segment's scenarios only)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", required=True)
    p.add_argument("--segment")
    p.add_argument("--unbind", action="store_true")
    p.set_defaults(func=cmd_library_bind)
    p = lsub.add_parser("selection", help="show or set which entries each query is shown: all, or the k most "
                        "similar to the query (top_k, BM25); frozen into each run and evaluation made after")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--mode", choices=list(SelectionMode))
    p.add_argument("--k", type=int, help="entries per query under top_k (1 to 30; default 3)")
    p.set_defaults(func=cmd_library_selection)
    p = lsub.add_parser("select", help="the entries a query is shown from a version (as the API's selection route)")
    p.add_argument("--task", required=True)
    p.add_argument("--library", default="default")
    p.add_argument("--query", required=True)
    p.add_argument("--label", default="production")
    p.add_argument("--version", help="a version's number in the library (e.g. 3) instead of a label")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_library_select)
