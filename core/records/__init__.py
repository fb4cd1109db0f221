"""What is stored and the operations on it: each function owns its transaction and its audit event."""
