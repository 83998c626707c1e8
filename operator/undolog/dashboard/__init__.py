"""The triage dashboard (`undolog dashboard`): server-rendered pages over the read model,
acting with the viewer's own credentials. Needs the `dashboard` extra (jinja2)."""
