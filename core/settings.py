"""The studio's configuration: one object read from the environment once per process.

Only names, numbers and paths live in `Settings`. Provider API keys stay in the provider's usual
environment variables (OPENAI_API_KEY, DEEPSEEK_API_KEY, ...): litellm reads them itself, and the studio's
own code reads a key or credential only through `secret()` here, at the call that needs it, so no key enters
this object, the database, a log or a page. No other module of core, storage, api or pages reads the
environment (tests/test_settings_reads.py keeps it so); a child process is given a copy of it.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.errors import InvalidInput

if TYPE_CHECKING:  # the database code loads at the first engine(): `python -m core --help` needs none of it
    from sqlalchemy.engine import Engine

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "local/qwen2.5-coder-0.5b"


def default_threads() -> int:
    """Every core but one for the embedded model: with all of them, the studio's pages took 5-22 s to load
    while a run worked, because Streamlit had no core left."""
    return max(1, (os.cpu_count() or 2) - 1)


class Settings(BaseSettings):
    """Every environment variable the studio reads, with its default (docs/reference/settings.md is generated
    from these fields)."""

    model_config = SettingsConfigDict(env_prefix="TFGRPO_", env_ignore_empty=True, extra="ignore")

    database_url: str = Field(default=f"sqlite:///{PROJECT_DIR / 'studio.db'}",
                              validation_alias=AliasChoices("DATABASE_URL", "TFGRPO_DATABASE_URL"),
                              description="any SQLAlchemy URL: the SQLite file by default, PostgreSQL for a team "
                              "(postgresql+psycopg://...); migrated with Alembic at start")
    db_pool_size: int = Field(default=5, ge=1, description="connections a server database's pool keeps open")
    db_max_overflow: int = Field(default=10, ge=0, description="connections the pool opens beyond its size "
                                 "under load")
    db_pool_recycle_s: int = Field(default=1800, ge=0, description="seconds before a pooled connection is "
                                   "replaced, before a proxy or firewall drops it (0: never)")
    model: str = Field(default=DEFAULT_MODEL, min_length=1, description="default model of every role")
    concurrency: int = Field(default=4, ge=1, le=1024, description="model calls in flight per model")
    local_slots: int = Field(default=1, ge=1, le=64, description="requests the embedded model's server works on "
                             "at once (more batch them, but a seeded run's answers then depend on what ran beside "
                             "them; bench/README.md)")
    local_ctx: int = Field(default=4096, ge=512, description="context tokens per slot of the embedded model")
    local_cache_mib: int = Field(default=512, ge=0, description="MiB of earlier prompts' state the embedded "
                                 "model's server keeps to reuse (llama.cpp's default, 8192, let it grow past 2 GB "
                                 "in one benchmark; 0: none)")
    threads: int = Field(default_factory=lambda: default_threads(), ge=1,
                         description="llama.cpp threads (default: cores minus one, so pages stay responsive)")
    model_dir: Path = Field(default=PROJECT_DIR / ".models", description="where the embedded GGUF is assembled, "
                            "and where a running model server records its address")
    model_stall_s: float = Field(default=90.0, ge=1, description="seconds the embedded model's server may hold "
                                 "requests without producing a token before its supervisor restarts it")
    model_idle_s: float = Field(default=900.0, ge=1, description="seconds unused after which a model server that a "
                                "worker or a CLI command started for itself stops")
    model_start_s: float = Field(default=180.0, ge=1, description="seconds a process waits for a model server it "
                                 "started to come up")
    local_in_process: bool = Field(default=False, description="call the embedded model inside each process, as "
                                   "before the model server (kept for one release; docs/configuration.md)")
    call_timeout_s: float = Field(default=120.0, gt=0, description="seconds one model request may take before "
                                  "it is retried (the embedded model's server: the call's deadline)")
    call_deadline_s: float = Field(default=600.0, gt=0, description="seconds one model call may take with all "
                                   "its retries, from when it first holds a slot")
    max_retries: int = Field(default=3, ge=0, le=20, description="retries of a model call after a transient error")
    stop_grace_s: float = Field(default=3.0, ge=0, description="seconds a stopping worker waits for the model "
                                "call in flight before it abandons it (the job is queued again; resume covers it)")
    stall_after_s: float = Field(default=30.0, ge=1, description="seconds without a heartbeat before an idle "
                                 "worker takes a running job over")
    no_autoworker: bool = Field(default=False, description="pages never start a worker process themselves")
    worker_log: Path = Field(default=PROJECT_DIR / "worker.log", description="log of a worker a page started")
    score_timeout_s: float = Field(default=5.0, gt=0, description="seconds one regex or math-verify score may take")
    score_memory_mb: int = Field(default=512, ge=128, description="address-space limit of a scoring process")
    max_missing_share: float = Field(default=0.1, ge=0, le=1, description="share of the queries two evaluations "
                                     "share that may lack answers (model-call errors) before a comparison or the "
                                     "validation gate refuses to decide")
    api_port: int = Field(default=8502, ge=1, le=65535, description="port of the HTTP API (`python -m core serve`)")
    api_max_body_bytes: int = Field(default=2_000_000, ge=1024, description="largest request body the API reads "
                                    "(413 above it)")
    api_rate_per_minute: int = Field(default=600, ge=1, description="requests one API key may make per minute "
                                     "(429 above it)")
    otlp_max_spans: int = Field(default=2000, ge=1, description="spans one OTLP request may carry (413 above it)")
    ingest_request_max_bytes: int = Field(default=8_000_000, ge=1024, description="bytes one trace or OTLP request "
                                          "may add to the database, counted as stored (413 above it)")
    ingest_key_daily_bytes: int = Field(default=500_000_000, ge=1024, description="bytes one ingest key may add "
                                        "to the database per UTC day, traces and OTLP spans together (429 past it)")
    otlp_held_per_service: int = Field(default=1000, ge=0, description="spans held per OpenTelemetry service "
                                       "that maps to no task yet (or whose message cannot be read); past it the "
                                       "oldest are dropped and counted")
    otlp_held_hours: float = Field(default=72.0, gt=0, description="hours a held OTLP span is kept waiting for "
                                   "its service to be mapped; older ones are dropped and counted")
    migrate_on_start: bool = Field(default=True, description="the app, the API, the worker and every command bring "
                                   "the database's schema up to date when they open it; off (0) for a team that "
                                   "runs `python -m core migrate` as a deploy step: a process then refuses a "
                                   "database behind the code's newest revision")
    oidc_metadata_url: str = Field(default="", description="the OpenID Connect provider's metadata URL "
                                   "(.../.well-known/openid-configuration); with the client id, sign-in through the "
                                   "provider is offered (the client and cookie secrets come from "
                                   "TFGRPO_OIDC_CLIENT_SECRET and TFGRPO_OIDC_COOKIE_SECRET; or all of it from the "
                                   "[auth] section of .streamlit/secrets.toml)")
    oidc_client_id: str = Field(default="", description="the studio's client id at the provider")
    oidc_redirect_uri: str = Field(default="", description="the studio's address with /oauth2callback, as "
                                   "registered at the provider (default http://localhost:8501/oauth2callback)")
    oidc_allowed_domains: str = Field(default="", description="comma-separated email domains whose people the "
                                      "provider signs in may enter the studio the first time without an admin "
                                      "adding them (with TFGRPO_OIDC_NEW_PERSON_ROLE); others are refused")
    oidc_new_person_role: str = Field(default="none", pattern="^(none|labeler|reviewer)$",
                                      description="the role a new person from an allowed domain gets: none (signed "
                                      "in, told whom to ask), labeler or reviewer")
    session_hours: float = Field(default=12.0, gt=0, description="hours a sign-in lasts; then the person signs in "
                                 "again")
    promotion_requires_comparison: bool = Field(default=False, description="production moves only to a version "
                                                "with a paired comparison against it (a written reason is not enough)")
    app_url: str = Field(default="http://localhost:8501", description="the studio's address as people open it: "
                         "a webhook's link to the page, run and step starts with it")
    webhook_allowlist: str = Field(default="", description="comma-separated host names and CIDRs whose webhook "
                                   "receivers may be internal (e.g. chat.internal,10.20.0.0/16,127.0.0.1); every other "
                                   "address but public unicast is refused, and a cloud metadata address always")
    webhook_timeout_s: float = Field(default=5.0, gt=0, description="seconds a webhook receiver may take to answer "
                                     "before the attempt counts as failed")
    webhook_max_attempts: int = Field(default=8, ge=1, description="attempts of one webhook delivery before it is "
                                      "given up (failed, kept in the log for a replay, a notice on the Overview)")
    webhook_retry_schedule_s: list[float] = Field(default=[5, 300, 1800, 7200, 18000, 36000, 36000], min_length=1,
                                                  description="seconds before a webhook's 2nd, 3rd, ... attempt "
                                                  "(Standard Webhooks' schedule; a JSON list; the last repeats)")
    webhook_threads: int = Field(default=4, ge=1, le=64, description="webhook endpoints a worker delivers to at once "
                                 "(each endpoint's deliveries stay in order; a hanging receiver holds one thread)")
    webhook_ca_file: Path | None = Field(default=None, description="a PEM bundle of the certificate authorities an "
                                         "https webhook receiver may be signed by (an internal chat server's private "
                                         "CA); unset: certifi's public roots")
    secret_key_file: Path = Field(default=PROJECT_DIR / "studio.key", description="the file of the key that "
                                  "encrypts stored webhook secrets when TFGRPO_SECRET_KEY is not set: made (mode "
                                  "0600) at the first secret; keep it out of the database's backups")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (tests that change the environment call `get_settings.cache_clear()`);
    a value that cannot be used is an InvalidInput naming its environment variable."""
    try:
        return Settings()
    except ValidationError as exc:
        raise InvalidInput("the environment has a setting that cannot be used: " + "; ".join(
            f"{variable_of(error['loc'])} {error['msg'].lower()} (got {error.get('input')!r})"
            for error in exc.errors())) from None


def variable_of(loc: tuple) -> str:
    """The environment variable of a Settings field, as a person sets it."""
    field = str(loc[0]) if loc else ""
    return "DATABASE_URL" if field in ("database_url", "DATABASE_URL") else f"TFGRPO_{field.upper()}"


def engine(url: str | None = None) -> Engine:
    """The engine of the configured database, or of `url` (the CLI's --db), with the configured connection
    pool: one per URL per process, migrated on first use unless TFGRPO_MIGRATE_ON_START is off, when a database
    behind the code's newest revision is an InvalidInput that says to run `python -m core migrate`."""
    from storage.db import SchemaBehind, get_engine

    try:
        return get_engine(url or get_settings().database_url, migrate=get_settings().migrate_on_start,
                          **database_pool())
    except SchemaBehind as exc:
        raise InvalidInput(str(exc)) from None


def database_pool() -> dict[str, int]:
    """The configured connection pool of a server database, as storage.db's engine arguments."""
    settings = get_settings()
    return {"pool_size": settings.db_pool_size, "max_overflow": settings.db_max_overflow,
            "pool_recycle": settings.db_pool_recycle_s}


def secret(name: str) -> str:
    """The value of the environment variable `name` that holds a key or a credential, '' when unset: read at
    the call that needs it and never kept."""
    return os.environ.get(name, "").strip()


def secrets_in_environment() -> dict[str, str]:
    """Every environment variable whose name says it holds a secret (KEY, TOKEN, SECRET, PASSWORD), so that
    an error message a provider echoed can be scrubbed of them."""
    return {name: value for name, value in os.environ.items()
            if value and re.search(r"KEY|TOKEN|SECRET|PASSWORD", name)}


def configure_scoring() -> None:
    """Give this process's scoring processes (core/domain/scoring.py) the configured limits; they start at the
    first score. Called once at the start of the CLI, the worker and the app."""
    from core.domain import scoring

    settings = get_settings()
    scoring.configure(time_limit_s=settings.score_timeout_s, memory_limit_mb=settings.score_memory_mb)
