"""Client for a Training-Free GRPO studio: fetch the promoted experience library for a live agent's system
prompt, and send its production traces back. Standard library only; a studio outage never fails the agent.

    from tfgrpo_client import get_library, log_trace
    lib = get_library("Bike shop", fallback="Be helpful.")
    # or, for a library that shows each query its most similar entries:
    lib = get_entries("Bike shop", question, fallback="Be helpful.")
    ...
    log_trace(task="Bike shop", input=question, output=answer, version_id=lib.version_id)
"""

from .client import Client
from .default import configure, default_client, flush, get_entries, get_library, log_trace, update_trace
from .library import Library
from .traces import FlushResult
from .transport import ClientError

__version__ = "0.1.0"
__all__ = ["Client", "ClientError", "FlushResult", "Library", "configure", "default_client", "flush", "get_entries",
           "get_library", "log_trace", "update_trace"]
