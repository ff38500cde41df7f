"""aegis_flow.k8s: node quarantine on Kubernetes and the cluster manifests of ``install``.

``nodes`` is pure (the node view, the patch bodies, the quarantine decisions); ``api`` is the
``NodeApi`` Protocol with an in-memory fake; ``client`` adapts the ``kubernetes`` package to it
(the only module here that talks to a cluster); ``install`` renders manifests; ``cli`` adds
``aegis-flow nodes`` and ``aegis-flow install``. Importing this package loads nothing heavy.
"""
