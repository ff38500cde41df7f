"""aegis_flow.bundle: the self-contained supervisor (``aegis-flow bundle``).

``build`` writes the ``.pyz``; ``boot`` is its entry point (standard library only); ``cli``
adds the subcommand. Importing this package loads nothing.
"""
