"""aegis_flow.supervisor."""
