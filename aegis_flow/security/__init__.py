"""Credentials for NATS: JWT minting over nkeys, the operator bootstrap, the credential issuer
and the worker's one-time credential fetch (``worker-init``).

Masters import this package; the supervisor never does (it only reads the creds file through
``aegis_flow.supervisor.creds``).
"""
