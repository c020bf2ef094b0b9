"""Who may talk to the shard: registration, certificates, revocations, TLS and peer identity.

Agents and operators register with single-use nonces (``registration``; claims are batched by
``writebatch``), get certificates from the shard's CA, and renew them; ``revocations`` keeps the
revoked serials, ``tls`` builds the server's credentials and ``interceptors`` turns a verified client
certificate into the caller's identity (and maps errors to status codes).
"""
