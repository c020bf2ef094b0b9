"""The gRPC servicers: convert the request, call the shard or the registrar, convert back.

One module per service (``agent``, ``operator``, ``registration``) and ``convert`` between protobuf
and the plain types. Errors become status codes in the interceptor (``nstance.server.identity``).
"""
