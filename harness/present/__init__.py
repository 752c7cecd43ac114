"""Presentation: one model of what a run says (sections, tables, caveats with codes, verdicts), rendered once.

The report's sections are ``model.Section`` objects built from the run folder alone; ``model.markdown`` writes
them. The answer sentence (``harness.sentence``) heads the console, ``claim.txt``, the report and the API.
"""
