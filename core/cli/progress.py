"""Progress of a job run in the foreground, on one status line of stderr."""

from __future__ import annotations

import sys
import time

from sqlalchemy.engine import Engine
from sqlmodel import Session

from storage.tables import Run


class StatusLine:
    """Counters on one status line: redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, stream=None) -> None:
        self.stream = sys.stderr if stream is None else stream  # the stderr of when it runs, not of the import
        self.tty = self.stream.isatty()
        self.last_line = ""
        self.last_print = 0.0

    def line(self, counters: dict) -> str:
        raise NotImplementedError

    def finished(self, counters: dict) -> bool:
        return False

    def __call__(self, counters: dict) -> None:
        line = self.line(counters)
        if line == self.last_line:
            return
        if self.tty:
            self.stream.write("\r" + line[:200].ljust(len(self.last_line)))
        elif time.monotonic() - self.last_print >= 2 or self.finished(counters):
            self.stream.write(line + "\n")
            self.last_print = time.monotonic()
        else:
            return  # not shown yet: the next call may show it (or a newer line)
        self.stream.flush()
        self.last_line = line

    def close(self) -> None:
        if self.tty and self.last_line:
            self.stream.write("\n")


class StageProgress(StatusLine):
    """A run's per-stage counters."""

    def line(self, c: dict) -> str:
        return (
            f"step {c['steps_done']}/{c['steps_total']} | rollouts {c['rollouts_done']}/{c['rollouts_total']} "
            f"| rewards {c['rewards']} | summaries {c['summaries']} | advantages {c['advantages']} "
            f"(skipped {c['groups_skipped']}, failed {c['groups_failed']}) | operations {c['operations']} "
            f"| tokens {c['tokens_in'] + c['tokens_out']} | ${c['cost']:.4f}"
        )

    def finished(self, c: dict) -> bool:
        return c["steps_done"] == c["steps_total"]



class VariantProgress(StatusLine):
    """A measurement's progress: variants done, the one being evaluated, calls and cost."""

    def __init__(self, engine: Engine, run_id: int, stream=None) -> None:
        super().__init__(stream)
        self.engine, self.run_id = engine, run_id

    def line(self, c: dict) -> str:
        with Session(self.engine) as session:
            progress = session.get(Run, self.run_id).progress or {}
        current = f" | now: {progress['current']}" if progress.get("current") else ""
        return (f"variants {progress.get('variants_done', 0)}/{progress.get('variants_total', '?')}{current} "
                f"| calls {c['calls']} (cache hits {c['cache_hits']}) | ${c['cost']:.4f}")

