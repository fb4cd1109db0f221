"""The Training-Free GRPO engine. No Streamlit here: the CLI, the worker and the pages all call in."""

import os

# litellm fetches a price table from the network on import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
