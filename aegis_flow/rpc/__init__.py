"""Generated gRPC/protobuf stubs of ``proto/aegis.proto`` (``make proto``; do not edit) and the
command that regenerates them. Imported only by masters and ``worker-init``, never by the
supervisor.
"""
