"""The Streamlit dashboard (not yet built)."""
