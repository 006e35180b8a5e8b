"""The documentation, shipped in the package as `gpulens.docs` so that `gpulens files docs/NAME.md` prints a
page that a message or --help names where the project's repository cannot be reached (gpulens/bundled.py)."""
