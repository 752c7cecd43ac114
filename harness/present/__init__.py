"""Presentation: sections, tables, caveats and verdicts built from a run folder, rendered once."""
