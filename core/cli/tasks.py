"""The task commands: the demo tasks, a task's dataset files, task files and personas, and a library's segment
and entry selection."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sqlmodel import Session

from core.cli.base import UsageError, engine_of, name_list, read_file, write_output
from core.domain.datasets import check_size, mapping_note, parse_mapping, resolve_columns
from core.domain.personas import check_file_size as check_persona_file_size
from core.domain.personas import parse_personas, persona_dicts
from core.records.library.coverage import version_coverage
from core.records.library.segments import bind_library
from core.records.library.selection import library_selection, set_selection
from core.records.library.versions import resolve_version
from core.records.production.serving import served_selection
from core.records.tasks.demos import ensure_demo_tasks
from core.records.tasks.lookup import get_task
from core.records.tasks.samples import add_dataset_file
from core.records.tasks.scenarios import add_scenarios, is_conversation, split_by_persona
from core.records.tasks.task_io import columns_of, export_task_json, import_task, save_personas, task_personas
from storage import queries


def cmd_demo(args: argparse.Namespace) -> int:
    for task in ensure_demo_tasks(engine_of(args)):
        print(task.name)
    return 0


def cmd_dataset_add(args: argparse.Namespace) -> int:
    """Columns nobody mapped are taken by core's rule (datasets.resolve_columns, applied by add_dataset_file),
    and said when renamed; the note reads the columns the way the Tasks page does (columns_of). After the
    counts come core's notes, the rows left out as duplicates, as the Tasks page shows them."""
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
    with Session(engine_of(args)) as session:
        task = get_task(session, args.task)
        counts = queries.count_samples(session, task.id)
    print(f"{task.name}: {sum(counts.values())} samples")
    for split in sorted(counts):
        print(f"  {split:<6}{counts[split]:>6}")
    return 0


def cmd_task_export(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        text = export_task_json(session, get_task(session, args.name))
    write_output(args.output, text, end="\n")
    return 0


def cmd_task_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    data = read_file(path, check_size)
    task = import_task(engine_of(args), data, "cli", rename=args.name)
    print(f"imported task {task.name!r}")
    return 0


def cmd_task_personas(args: argparse.Namespace) -> int:
    """Replace a task's personas from a file, or print them (--show) as JSON that can be edited and loaded
    back; one or the other, so a forgotten file name never silently shows instead of saving."""
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
    names = name_list(args.test)
    counts = split_by_persona(engine_of(args), args.task, names)
    print(f"{args.task}: " + ", ".join(f"{split} {count}" for split, count in sorted(counts.items())))
    return 0


def cmd_library_bind(args: argparse.Namespace) -> int:
    """Bind a library to a persona segment (or unbind it): segment-routed evaluations use it for that segment."""
    if bool(args.segment) == bool(args.unbind):
        raise UsageError("library bind: give --segment SEGMENT or --unbind")
    library = bind_library(engine_of(args), args.task, args.library, None if args.unbind else args.segment)
    print(f"library {library.name!r} of {args.task}: " + (f"serves segment {library.segment}" if library.segment
                                                            else "serves no segment"))
    return 0


def cmd_library_selection(args: argparse.Namespace) -> int:
    """Show the library's entry selection, or set it (`--mode all|top_k`, `--k N`; audited)."""
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


def cmd_library_coverage(args: argparse.Namespace) -> int:
    """How many train references a version covers, and which are not covered, each with its message (issue 44)."""
    with Session(engine_of(args)) as session:
        task = get_task(session, args.task)
        library = queries.library_by_name(session, task.id, args.library)
        if library is None:
            raise UsageError(f"task {task.name!r} has no library {args.library!r}")
        version = resolve_version(session, task, args.version, args.library)
        train = queries.samples(session, task.id, "train")
        found = version_coverage(session, task, library, version, train)
        queries_by_name = {s.external_id: s.query for s in train}
    print(f"library {library.name!r} #{version.number if version else 0}: {found.line()}")
    for name in found.uncovered:
        print(f"  {name}: {' '.join(queries_by_name.get(name, '').split())[:100]}")
    return 0
