"""Sources the agent samples itself (the in-server sources live in ``hooks``)."""
