"""The security suite's one shared target: a real ``nstance-server`` (``SecurityShard``) per session.

After the whole suite the server must still be healthy, must not have answered anything with
``internal error``, and must stop cleanly (exit status 0): every attack gets a mapped status code.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nstance.testing.securityshard import SecurityShard


@pytest.fixture(scope="session")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecurityShard]:
    target = SecurityShard(tmp_path_factory.mktemp("security"))
    try:
        yield target
        target.assert_healthy()
    finally:
        code = target.stop()
    assert target.internal_errors() == [], "the server answered an attack with INTERNAL"
    assert code == 0, f"the server did not stop cleanly (exit {code}); log:\n{target.process.log()}"
