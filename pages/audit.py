"""Audit page (placeholder, being written)."""

import streamlit as st

from pages._common import require_app

require_app()
st.title("Audit")
