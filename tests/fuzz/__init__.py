"""Fuzz tier: schemathesis against a real API process, both token scopes, seeded and bounded."""
