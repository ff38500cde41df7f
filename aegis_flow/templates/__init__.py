"""aegis_flow.templates."""
