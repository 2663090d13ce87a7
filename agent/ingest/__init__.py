"""The agent's ingest: the versioned socket protocol, its server and a blocking client."""
