"""The roles a person and an API key may hold, lowest first: names only, so the command line's parser offers
them (`user add --role`, `apikey create --role`) before any database code loads. core.records.people and
core.records.api_keys check and rank them."""

from __future__ import annotations

ROLES = ("labeler", "reviewer", "admin")
API_ROLES = {"read": "fetch libraries", "ingest": "fetch libraries and post production traces"}
