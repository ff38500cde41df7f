"""aegis-flow."""
