"""Public-key infrastructure: keys, the cluster CA, certificates, peer identity and nonce JWTs.

Modules:

* ``keys`` — generate, serialise and load ECDSA P-256 / Ed25519 keys; refuse other key types.
* ``serial`` — random 128-bit certificate serial numbers and their canonical hex form.
* ``ca`` — create and load the cluster certificate authority.
* ``certs`` — issue client (agent/operator), server and workload certificates; the role extension.
* ``peer`` — turn a presented client certificate into a verified ``PeerIdentity``.
* ``nonce`` — sign and verify registration nonce JWTs (EdDSA, algorithm pinned).

This package only computes: it does no network or file I/O, keeps no state, reads time only from an
injected ``Clock`` and imports nothing from Nstance beyond ``nstance.core``.
"""
