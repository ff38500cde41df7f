"""aegis_flow.verify."""
