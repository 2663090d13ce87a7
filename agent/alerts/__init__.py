"""Alerting: rules over the records, evaluated live in the agent and offline in ``analyze``.

``rules`` (the rule table), ``engine`` (:class:`AlertEngine`), ``device`` (one device's
analysis state), ``metrics`` (what a rule reads), ``sinks``, ``offline`` and ``prom_rules``;
docs/alerts.md. Alerts sit above analysis: they import its models; analysis imports nothing from
here. Import from the module that defines a name; this package re-exports nothing.
"""
