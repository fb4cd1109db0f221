"""The pure domain: no database, no model call, no settings (import-linter keeps it so)."""
