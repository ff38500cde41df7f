"""aegis_flow.steps."""
