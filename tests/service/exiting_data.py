"""A custom data set factory that ends its process (as a crashing native library would): checking a spec
that uses it kills the spec checker, and the API must say so and carry on."""

from __future__ import annotations

import os

FACTORY = "tests.service.exiting_data:make_dataset"
EXIT_CODE = 3


def make_dataset() -> None:
    os._exit(EXIT_CODE)
