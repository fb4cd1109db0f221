"""What both trace doors share (core/records/production/ingest.py): a request that meets another writer's ids at
the unique key runs again, and past its attempts answers a Conflict (409), not a 500."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from core.errors import Conflict
from core.records.production.ingest import ATTEMPTS, Ingested, retried


def racing(times: int):
    """A write that meets the unique key `times` times, then stores."""
    calls = []

    def write() -> Ingested:
        calls.append(1)
        if len(calls) <= times:
            raise IntegrityError("INSERT INTO trace", {}, Exception("UNIQUE constraint failed"))
        return Ingested(stored=1)

    return write, calls


def test_a_write_that_met_another_writer_runs_again_until_its_attempts_are_spent():
    write, calls = racing(ATTEMPTS - 1)
    assert retried(write).stored == 1 and len(calls) == ATTEMPTS


def test_past_its_attempts_a_race_is_a_conflict_that_asks_for_the_request_again():
    write, calls = racing(ATTEMPTS)
    with pytest.raises(Conflict, match="send this one again"):
        retried(write)
    assert len(calls) == ATTEMPTS and Conflict.http_status == 409


def test_the_json_answer_keeps_the_routes_keys():
    assert Ingested(stored=2, duplicates=1).as_json() == {"stored": 2, "duplicates": 1, "outside_experiment": []}
