"""The validation gate's held-out queries: the split it reads and how many train queries it holds out.

Pure numbers, read by the gate (core.grpo.gate) and by the run estimates (core.records.runs.progress), which
plan the gate's calls before a run exists.
"""

VALIDATION_SPLIT = "validation"
MAX_HELD_OUT = 50
MIN_HELD_OUT = 8
MIN_GATE_QUERIES = 4  # with fewer, neither the interval nor the sign test can say anything


def held_out_size(n_train: int, setting: int | None) -> int:
    """How many train queries to hold out: the setting, else 20% within 8 to 50, never more than half."""
    if setting is not None:
        return min(setting, max(n_train - 1, 0))
    return min(MAX_HELD_OUT, max(round(0.2 * n_train), min(MIN_HELD_OUT, n_train // 2)))
