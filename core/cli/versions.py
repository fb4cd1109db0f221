"""The version commands: export and import a library version, list runs and versions, label and promote."""

from __future__ import annotations

import argparse
from pathlib import Path

from sqlmodel import Session

from core.cli.base import UsageError, engine_of, read_file, write_output
from core.cli.report import print_version, report_run, worker_or_here
from core.domain.library_io import check_file_size, decode_library
from core.errors import NotFound
from core.jobs import run_control
from core.records.library.coverage import version_coverage
from core.records.library.promotion import preview_promotion
from core.records.library.segments import routed_export
from core.records.library.versions import (
    export_version,
    import_library,
    promote,
    resolve_version,
    set_label,
    version_in_library,
    version_json_meta,
)
from core.records.tasks.lookup import get_task
from storage import queries
from storage.statuses import JobStatus
from storage.tables import LibraryVersion, Run


def cmd_export(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        task = get_task(session, args.task)
        version = resolve_version(session, task, args.version, args.library)
        if args.route_segments:
            if args.format == "json":
                raise UsageError("export --route-segments writes JSON around md or prompt text: use --format md "
                                 "or prompt")
            text = routed_export(session, task, version, args.format)
        else:
            text = export_version(version.experiences if version else [], args.format,
                                  version_json_meta(task, version), task=task)
    write_output(args.output, text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    text = decode_library(read_file(path, check_file_size), path.name)
    print_version(import_library(engine_of(args), args.task, text, path.name, library_name=args.library))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        task_id = get_task(session, args.task).id if args.task else None
        rows = queries.runs(session, task_id)
        tasks = {t.id: t.name for t in queries.list_tasks(session)}
        numbers = queries.version_numbers(session, sorted({r.current_version_id for r in rows if r.current_version_id}))
        print(f"{'run':>4}  {'status':<16}{'kind':<7}{'task':<28}{'steps':>7}  {'version':>7}  created")
        for run in rows:
            steps = f"{run.progress.get('steps_done', 0)}/{run.progress.get('steps_total', 0)}"
            version = f"#{numbers[run.current_version_id]}" if run.current_version_id in numbers else "-"
            print(f"{run.id:>4}  {run.status:<16}{run.kind:<7}{tasks.get(run.task_id, '?')[:27]:<28}{steps:>7}  "
                  f"{version:>7}  {run.created_at:%Y-%m-%d %H:%M}"
                  + (f"  error: {run.error}" if run.error else ""))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Show a run and what it waits for; with --pause, --resume or --cancel, change its status first
    (core.jobs.run_control: the Train page's buttons) and print the status it has now."""
    engine = engine_of(args)
    if args.control:
        change = {"pause": run_control.pause_run, "resume": run_control.resume_run, "cancel": run_control.cancel_run}
        status = change[args.control](engine, args.run_id, "cli")
        with Session(engine) as session:
            run = session.get(Run, args.run_id)
        after = {JobStatus.PAUSED: f"a worker executing it stops at its next progress tick; resume it with "
                                   f"python -m core run {run.id} --resume",
                 JobStatus.QUEUED: worker_or_here(run),
                 JobStatus.CANCELLED: "the versions it created stay"}.get(status, "")
        print(f"run {run.id}: {status}" + (f"; {after}" if after else ""))
        return 0
    with Session(engine) as session:
        if session.get(Run, args.run_id) is None:
            raise NotFound(f"no run {args.run_id}")
    return report_run(engine, args.run_id)


def cmd_versions(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        task = get_task(session, args.task)
        for lib in queries.libraries(session, task.id):
            if args.library and lib.name != args.library:
                continue
            names = {}
            for label in queries.labels(session, lib.id):
                names.setdefault(label.version_id, []).append(label.name)
            print(f"library {lib.name!r}")
            stored = queries.versions(session, lib.id)
            numbers = {v.id: v.number for v in stored}
            for v in stored:
                tags = f" [{', '.join(names[v.id])}]" if v.id in names else ""
                parent = f" from #{numbers[v.parent_id]}" if v.parent_id in numbers else ""
                number = f"#{v.number}"
                print(f"  {number:>5}  {v.source:<8}{len(v.experiences):>3} experiences{parent}"
                      f"  {v.created_at:%Y-%m-%d %H:%M}  {v.note}{tags}")
            latest = queries.latest_version(session, lib.id)
            if latest is not None:
                print(f"  latest #{latest.number}: {version_coverage(session, task, lib, latest).line()}")
    return 0


def cmd_label(args: argparse.Namespace) -> int:
    """Point a label at a version; `production` moves through the promotion guard (a comparison, or --reason)."""
    engine = engine_of(args)
    label = set_label(engine, args.task, args.version, args.name, "cli", library_name=args.library,
                      reason=args.reason or "")
    with Session(engine) as session:
        print(f"{args.name} -> version #{session.get(LibraryVersion, label.version_id).number}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    """Show what promoting a version changes and what the comparison with production says, then move
    `production` (refused, exit 2, without a paired comparison or --reason); --dry-run only shows."""
    engine = engine_of(args)
    with Session(engine) as session:
        version_id = version_in_library(session, args.task, args.version, args.library).id
    preview = preview_promotion(engine, version_id)
    current = f"#{preview.production_number}" if preview.production_id else "none"
    print(f"promote version #{preview.version_number} to production; production now: {current}")
    print(preview.evidence)
    if preview.changes:
        print(preview.diff_lines())
    if args.dry_run:
        refusal = preview.refusal(args.reason or "")
        print("dry run: nothing moved" + (f"; as given, promoting would be refused: {refusal}" if refusal else ""))
        return 0
    promote(engine, version_id, "cli", reason=args.reason or "")
    print(f"production -> version #{preview.version_number}")
    return 0
