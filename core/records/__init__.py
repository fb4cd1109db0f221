"""What is stored and the operations on it, each with its audit event, in one package a subject: from the ground
up people, tasks, evaluation, library, runs, notifications, keys, models, review, production. A subject imports only
those below it (pyproject.toml's contracts; docs/contributing.md has the table); what a higher one must hear of
(a label moved) is announced on a hook it registers on (library/events.py, wired by subscribers.py).

The first argument says who owns the transaction. A function that changes what is stored takes the
engine and owns its transaction: it opens it, commits it and writes its audit event, so a page, the CLI
and the API call it alone. A function that takes a Session never commits: it reads (a page draws several
reads from one session), or it is one step of the transaction its caller owns. tests/test_records_arguments.py
keeps the rule.
"""
