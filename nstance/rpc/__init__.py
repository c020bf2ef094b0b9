"""Generated gRPC and protobuf code for the ``nstance.v1`` wire API. GENERATED ONLY.

Every ``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py`` and ``*_pb2_grpc.pyi`` module here is produced
from ``protos/nstance/v1/*.proto`` by ``scripts/gen_proto.py`` (``make proto``) and committed.
Never edit them by hand: change the ``.proto`` files and regenerate. ``make proto-check`` and
``tests/unit/test_generated_code.py`` fail when these files drift from the protos.
"""
