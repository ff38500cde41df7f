"""aegis_flow.local."""
