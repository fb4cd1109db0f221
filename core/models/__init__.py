"""Model calls: the gateway (cache, ledger, retries), the embedded model, and the judges."""
