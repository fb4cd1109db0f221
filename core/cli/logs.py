"""Logging for the command line and the worker: the studio's own messages at the level asked for, other
libraries' only from WARNING up.

A library may set its own logger to DEBUG when it is imported (bm25s does: one "Building index from tokens" line
per ranked query, 1,643 of them in one worker's log), so lowering loggers' levels at start-up is not enough: a
filter on the root handlers drops another library's records below `third_party`, whatever its logger's level.
"""

from __future__ import annotations

import logging

OURS = ("core", "storage", "api", "__main__")  # the studio's own loggers, by their top-level name
NOISY = ("LiteLLM", "litellm", "httpx", "httpcore", "bm25s", "urllib3")  # loud libraries, lowered as well
FORMAT = "%(levelname)s %(name)s: %(message)s"


class ThirdPartyFilter(logging.Filter):
    """Lets the studio's records through and another library's only from `level` up."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or record.name.split(".", 1)[0] in OURS


def configure_logging(level: int, third_party: int = logging.WARNING, stream=None) -> None:
    """The root logger at `level` with one handler (to stderr, or `stream`) that passes other libraries' records
    only from `third_party` up; called once by the command line and again by the worker (INFO). Where logging
    already belongs to someone else (a program that embeds the command line, pytest), it is left alone."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if any(isinstance(f, ThirdPartyFilter) for f in h.filters)]
    if root.handlers and not ours:
        return
    if not ours:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(FORMAT))
        handler.addFilter(ThirdPartyFilter(third_party))
        root.addHandler(handler)
    root.setLevel(level)
    for name in NOISY:
        logging.getLogger(name).setLevel(max(third_party, logging.getLogger(name).level))
