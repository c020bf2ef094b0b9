"""The security suite: what an attacker (or a careless operator) can try, and what they must see.

Run it with ``.venv/bin/pytest tests/security``; ``docs/security.md`` lists what it covers.
"""
