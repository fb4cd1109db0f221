"""The HTTP API's keys and limits: keys for live agents (hashed, role- and task-scoped) and the shared rate
and storage allowances every API process counts against."""
