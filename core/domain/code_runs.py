"""Tool-integrated reasoning's conventions: where a model's turn stops, which code runs, how its output comes back.

Qwen-style models trained on tool-integrated reasoning write a ```python block, then the block's result as
```output, then go on. Left alone they invent that output (and often box an answer on it), so the agent asks
the provider to stop generating at STOP_SEQUENCES, runs the message's last code block itself, and sends the
real output back in the same fence (Qwen2.5-Math's evaluation/math_eval.py does the same). A provider that
ignores `stop` (litellm drops what a provider does not take) is held to it by `cut_at_stop`.

A code run is stored inside the rollout's messages, on the message that carries its output to the model
(`"code_run": {...}`), so a rollout keeps every run without a table or migration of its own; `for_model`
strips that key before messages go to a provider, and `code_runs` reads the runs back for display.

Pure: no database, model or Streamlit code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from core.domain.sandbox import SandboxResult, extract_code_blocks, signal_name

OUTPUT_FENCE = "```output"
STOP_SEQUENCES = (OUTPUT_FENCE,)
CODE_RUN_KEY = "code_run"


def cut_at_stop(text: str, stops: tuple[str, ...] = STOP_SEQUENCES) -> str:
    """The text before the first stop sequence (right-stripped): what a provider that honours `stop` returns."""
    cut = len(text)
    for stop in stops:
        at = text.find(stop)
        if at != -1:
            cut = min(cut, at)
    return text[:cut].rstrip() if cut < len(text) else text


def pending_code(text: str) -> str | None:
    """The code of the message's last Python block, the one to run; None when the message holds none.

    Only the last block runs (as in Qwen2.5-Math): generation stops where the model would write that block's
    output, so an earlier block in the same message is one the model chose to move past."""
    blocks = extract_code_blocks(text)
    return blocks[-1] if blocks else None


@dataclass(frozen=True)
class CodeRun:
    """One run of model-written code in the jail, as stored on the rollout: `exit_code` is None when the run
    was killed at its time limit (`timed_out`)."""

    code: str
    output: str
    seconds: float
    exit_code: int | None
    timed_out: bool = False

    @classmethod
    def from_result(cls, code: str, result: SandboxResult, seconds: float) -> CodeRun:
        return cls(code=code, output=result.as_text(), seconds=round(seconds, 3), exit_code=result.exit_code,
                   timed_out=result.timed_out)

    @classmethod
    def from_dict(cls, data: dict) -> CodeRun:
        """A stored run, tolerant of missing or mistyped fields (stored JSON is read, never trusted)."""
        exit_code = data.get("exit_code")
        seconds = data.get("seconds")
        return cls(code=str(data.get("code") or ""), output=str(data.get("output") or ""),
                   seconds=float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool)
                   else 0.0,
                   exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
                   timed_out=bool(data.get("timed_out")))

    def status(self) -> str:
        """"exit 0", "exit 1", "killed by SIGKILL", "timed out"."""
        if self.timed_out:
            return "timed out"
        if self.exit_code is None:
            return "no exit status"
        if self.exit_code < 0:
            return f"killed by {signal_name(-self.exit_code)}"
        return f"exit {self.exit_code}"


def output_text(run: CodeRun) -> str:
    """What the model reads after its code: the real output in the fence it would have written itself."""
    return f"{OUTPUT_FENCE}\n{run.output}\n```"


def output_message(run: CodeRun) -> dict:
    """The message that carries a run's output to the model and keeps the run on the rollout."""
    return {"role": "user", "content": output_text(run), CODE_RUN_KEY: asdict(run)}


def for_model(messages: list[dict]) -> list[dict]:
    """The messages as a provider takes them: role and content only (a stored run is ours, not the API's)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def code_runs(messages: list[dict] | None) -> list[CodeRun]:
    """The code runs stored in a rollout's messages, in order."""
    return [CodeRun.from_dict(m[CODE_RUN_KEY]) for m in messages or []
            if isinstance(m, dict) and isinstance(m.get(CODE_RUN_KEY), dict)]


def is_code_run(message: dict) -> bool:
    return isinstance(message, dict) and isinstance(message.get(CODE_RUN_KEY), dict)
