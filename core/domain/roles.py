"""The roles a person and an API key may hold, lowest first: names only, so the command line's parser offers
them (`user add --role`, `apikey create --role`) before any database code loads. core.records.people.roles and
core.records.keys.api_keys check and rank them."""

from __future__ import annotations

ROLES = ("labeler", "reviewer", "admin")
# A person the provider signed in who has no role yet (a new person from an allowed domain, by default): every role
# check refuses them, and the studio shows whom to ask.
NO_ROLE = "none"
PERSON_ROLES = (NO_ROLE, *ROLES)
API_ROLES = {"read": "fetch libraries", "ingest": "fetch libraries and post production traces"}
# The lowest role of a person for whom a key of each API role may be made: a key carries at most its person's role.
API_ROLE_NEEDS = {"read": "labeler", "ingest": "reviewer"}
