"""How the agent answers: `direct` (one reply) or `python` (it may write code, which runs in the jail and
whose output it reads before answering; core.domain.code_runs). A task's setting, read by the task files, the
Tasks page and the agent (core.grpo.agent)."""

AGENT_MODES = ("direct", "python")
