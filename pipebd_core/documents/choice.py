"""choices/<n>/choice.json: one choice made again from a finished search's candidate library.

Written by `pipebd_core/distill/choose.py` beside the choice's architecture.json and network: the budget
it was made for, the layers it chose, what it reached, the held-out perplexity of its network, and how
long choosing took (no rank is launched: the time is the solve, the assembly and the evaluation).
"""

from __future__ import annotations

from pydantic import ConfigDict

from pipebd_core.documents.base import Document


class ChoiceRecord(Document):
    NAME = "choice.json"
    VERSION = 1
    model_config = ConfigDict(extra="forbid")

    index: int  # n of choices/<n>/
    budget: dict[str, float] | None  # fractions of the teacher's layers, by cost (None: the lowest loss)
    layers: list[str]  # per layer, the chosen candidate
    chosen_by: str
    reached: dict[str, float]  # the choice's costs as fractions of the teacher's
    perplexity: float | None  # held-out, of the chosen network (a language model)
    seconds: float  # wall time of the whole choice, evaluation included
