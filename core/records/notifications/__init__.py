"""Notifications: the webhook outbox written in the transaction of each change (events.py), the endpoints,
their delivery and the key that seals their secrets."""
