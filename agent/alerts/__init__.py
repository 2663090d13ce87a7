"""Alerting: rules over the records, evaluated live in the agent and offline in ``analyze``.

- :mod:`~vramscope.agent.alerts.rules` — the rule table (built-ins from the ``alerts.*``
  settings plus ``[[alerts.rules]]``), validated with errors that name the rule;
- :mod:`~vramscope.agent.alerts.engine` — :class:`AlertEngine`, the rules evaluated
  incrementally over records (no I/O, no clock);
- :mod:`~vramscope.agent.alerts.device` — :class:`DeviceAnalysis`, one device's analysis
  state (its processes' models and which of them leads), what the rules read;
- :mod:`~vramscope.agent.alerts.metrics` — how each rule metric is read from that state and
  which records can change it;
- :mod:`~vramscope.agent.alerts.sinks` — the :class:`AlertSink` seam and the log, store and
  webhook sinks (the webhook delivers from its own thread);
- :mod:`~vramscope.agent.alerts.offline` — a recording through the engine into the
  ``vramscope.analysis/1`` document;
- :mod:`~vramscope.agent.alerts.prom_rules` — the rules as a Prometheus alerting-rules file.

Alerts sit above analysis: they import its models; analysis imports nothing from here.
Import from the module that defines a name; this package re-exports nothing.
"""
