"""``aegis-flow rehearse``: a local Argo Workflows executor (see docs/argo.md)."""
