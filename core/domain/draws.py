"""Stable draws: a fraction that depends only on a text, so the same trace, user or row always falls on
the same side of a share (labelling samples, A/B arms) on every machine and every run."""

from __future__ import annotations

import hashlib


def stable_fraction(text: str) -> float:
    """A number in [0, 1) from the sha256 of `text`."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / 16 ** 12
