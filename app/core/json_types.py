"""The one name for a JSON document whose shape is the user's, not ours (a spec as sent, a search's overrides).

Where the shape is known, a typed model says so instead; this alias is only for documents that are
arbitrary JSON objects by nature, and is defined here alone.
"""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]  # an arbitrary JSON object: keys are strings, values any JSON
