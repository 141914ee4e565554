"""The REST API under /api/v1: one router per resource in routes/."""
