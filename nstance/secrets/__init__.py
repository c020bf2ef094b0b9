"""Secret stores: where the CA key, the registration-nonce key and template secrets live.

Modules:

* ``base`` — the ``SecretStore`` protocol, its errors and the secret-name rule.
* ``memory`` — an in-process store for tests and the simulator.
* ``objectstorage`` — secrets as AES-256-GCM encrypted objects in an ObjectStore (the embedded default).
* ``aws`` — AWS Secrets Manager (boto3).
* ``keys`` — loading the 32-byte encryption key(s) from an environment variable or a file.
* ``factory`` — open a store by provider name.

This package may import ``nstance.core``, ``nstance.objectstore.base`` and boto3; nothing else from
Nstance. It never logs or puts secret values or keys into error messages.
"""
