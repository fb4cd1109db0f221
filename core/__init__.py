"""The Training-Free GRPO engine. No Streamlit here: the CLI, the worker and the pages all call in."""
