"""Model calls: the gateway (cache, ledger, retries), the embedded model, the judges and the prices.

litellm is imported only under this package; it would fetch its price table from the network on import
unless told to use the copy it ships with, so that is set here, before any module of the package runs.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
