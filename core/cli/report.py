"""What the run commands print about a run (`train`, `run`) and a version (`train`, `import`)."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from sqlmodel import Session

from core.records.gate_verdict import GateVerdict
from core.records.run_settings import run_settings
from storage import queries
from storage.statuses import GroupStatus, JobStatus, OperationStatus
from storage.tables import LibraryVersion, Run


def print_version(version: LibraryVersion | None) -> None:
    """A version's experiences, one a line, or that the library is empty."""
    if version is None:
        print("version: empty library")
        return
    print(f"version {version.id} (#{version.number}, {version.source}): {len(version.experiences)} experiences")
    for exp in version.experiences:
        print(f"  [{exp['id']}] {exp['text']}")


def report_run(engine: Engine, run_id: int) -> int:
    """A run's status, counters, gate verdicts, problems and version; exit code 1 unless it ended well."""
    from core.grpo.training import run_counters

    with Session(engine) as session:
        run = session.get(Run, run_id)
        counters = run_counters(session, run)
        version = session.get(LibraryVersion, run.current_version_id) if run.current_version_id else None
        problems, gates = [], []
        for step in queries.steps(session, run.id):
            where = f"epoch {step.epoch + 1} batch {step.batch_index + 1}"
            if gate := GateVerdict.of(step):
                gates.append(f"  {where}: {gate.line}")
            if step.error:
                problems.append(f"{where}: {step.error}")
            unscored = [r for r in queries.step_rollouts(session, step.id) if r.reward_source == "error"]
            if unscored:
                problems.append(f"{where}: {len(unscored)} rollouts could not be scored: {unscored[0].reward_detail}")
            for adv in queries.step_advantages(session, step.id):
                if adv.status == GroupStatus.FAILED:
                    problems.append(f"{where}, sample {adv.sample_id}: group failed: {adv.error}")
            for op in queries.step_operations(session, step.id):
                if op.status == OperationStatus.INVALID:
                    problems.append(f"{where}: {op.op} {op.target_ids} rejected: {op.validation_error}")
    print(f"run {run.id}: {run.status}" + (f" ({run.error})" if run.error else ""))
    print(f"calls {counters['calls']} (cache hits {counters['cache_hits']}), tokens in {counters['tokens_in']}, "
          f"out {counters['tokens_out']}, cost ${counters['cost']:.4f}")
    print(f"structured replies repaired {counters['replies_repaired']}, malformed {counters['replies_malformed']}")
    if gates:
        print(f"validation gate ({run_settings(run).gate}, "
              f"{run.progress.get('validation_queries', 0)} {run.progress.get('validation_split', '')} queries):")
        for line in gates:
            print(line)
    for line in problems:
        print(f"  note: {line}")
    print_version(version)
    return 0 if run.status in (JobStatus.COMPLETED, JobStatus.AWAITING_REVIEW, JobStatus.PAUSED) else 1
