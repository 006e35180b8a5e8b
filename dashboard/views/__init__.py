"""The pages' logic without Streamlit: pure functions from source records to what each page shows."""
