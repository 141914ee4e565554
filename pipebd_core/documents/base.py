"""The base of every typed document: a format version, `to_json` and `from_json`.

A document is a pydantic model; `to_json()` gives the JSON value written to disk (or sent across a
process), `from_json(value)` validates one back. Every document carries `format_version`; a value of
another version, or without one (written before documents were versioned), is refused with a
`DocumentError` that names the document, the version found and the one this PipeBD reads, so an old
run directory or cache entry fails where it is read, saying so, never half-way through a job.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError


class DocumentError(ValueError):
    """A document that cannot be read: another format version, or a value that does not validate."""


class Document(BaseModel):
    """A versioned JSON document. Subclasses set NAME (what a user calls it) and VERSION."""

    model_config = ConfigDict(extra="forbid")

    NAME: ClassVar[str] = "document"
    VERSION: ClassVar[int] = 1
    # fields added to this VERSION after documents of it were committed (benchmark records' frozen profiles),
    # with their defaults: written only where they differ, so a document written before them keeps its digest
    LATER_FIELDS: ClassVar[dict[str, object]] = {}

    format_version: int = 0  # set to VERSION on creation (see model_post_init)

    def model_post_init(self, context: Any) -> None:
        if self.format_version == 0:
            self.format_version = self.VERSION

    def to_json(self) -> dict[str, Any]:
        """The JSON value of this document (what is written to disk; LATER_FIELDS left out at their defaults)."""
        data = self.model_dump(mode="json")
        for name, default in self.LATER_FIELDS.items():
            if name in data and data[name] == default:
                del data[name]
        return data

    def digest(self) -> str:
        """A hash of the content (16 hex digits of the SHA-256 of its JSON, keys sorted): equal documents,
        equal digests; what a benchmark record names a profile by."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """Validate a JSON value as this document; DocumentError when its version or shape is not this one's."""
        found = data.get("format_version") if isinstance(data, dict) else None
        if found != cls.VERSION:
            written = "without a format version (an earlier PipeBD)" if found is None else f"as version {found}"
            raise DocumentError(
                f"{cls.NAME} was written {written}; this PipeBD reads version {cls.VERSION}: run its spec again"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise DocumentError(f"{cls.NAME}: {error}") from None
