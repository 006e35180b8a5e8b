"""The alerts' runbooks, one `<alert>.md` each, shipped in the package as `gpulens.runbooks` so that the
dashboard serves them where the project's repository cannot be reached (gpulens/bundled.py)."""
