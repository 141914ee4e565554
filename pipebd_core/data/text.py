"""Text as token sequences (`data.dataset: text`): a folder of .txt and .jsonl files, tokenized, packed.

Files are read in sorted path order (recursively): a .txt (or .md) file is one document, a .jsonl file one
document per line (its "text" field). Documents are tokenized by a local Hugging Face tokenizer
(`data.tokenizer`, a folder holding tokenizer.json) or, by default, as UTF-8 bytes (token = byte value,
256 = end of document), joined with an end-of-document token and packed into sequences of
`data.seq_len` + 1 tokens: an item is (the first seq_len tokens, the seq_len tokens that follow each),
the inputs and next-token labels of a causal LM. The split is fixed whatever the spec's seed: a
permutation seeded with SPLIT_SEED puts EVAL_FRACTION of the sequences (at least one) in `eval`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from torch.utils.data import Dataset

from pipebd_core.spec import Spec, SpecError

BYTE_EOS = 256  # end of document in the byte-level default: one past the 256 byte values
SPLIT_SEED = 2025
EVAL_FRACTION = 0.1
SUFFIXES = (".txt", ".md", ".jsonl")  # .md: markdown read as plain text
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")  # a tokenizer's end of document, if any


def read_documents(root: Path) -> list[str]:
    """Every document under `root`, in sorted path order; SpecError naming the file and line that is bad."""
    if not root.is_dir():
        raise SpecError(f"data.root: text folder {root} does not exist (nothing is downloaded)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        raise SpecError(f"data.root: {root} holds no .txt, .md or .jsonl files")
    documents = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix != ".jsonl":
            documents.append(text)
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise SpecError(f"data.root: {path}:{number} is not JSON: {error}") from None
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                raise SpecError(f'data.root: {path}:{number} needs a "text" field holding a string')
            documents.append(item["text"])
    return documents


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255, and BYTE_EOS between documents."""

    vocab_size = BYTE_EOS + 1
    eos: int | None = BYTE_EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class LocalTokenizer:
    """A Hugging Face `tokenizers` tokenizer from a local folder's tokenizer.json."""

    def __init__(self, folder: str) -> None:
        from tokenizers import Tokenizer

        path = Path(folder).expanduser() / "tokenizer.json"
        if not path.is_file():
            raise SpecError(f"data.tokenizer: {path} not found; give a folder holding a tokenizer.json")
        try:
            self.inner = Tokenizer.from_file(str(path))
        except Exception as error:
            raise SpecError(f"data.tokenizer: {path} cannot be read as a tokenizer: {error}") from None
        self.vocab_size = int(self.inner.get_vocab_size(with_added_tokens=True))
        found = [self.inner.token_to_id(name) for name in EOS_NAMES]
        self.eos = next((token for token in found if token is not None), None)

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False).ids)


def tokenizer_of(spec: Spec) -> ByteTokenizer | LocalTokenizer:
    return LocalTokenizer(spec.data.tokenizer) if spec.data.tokenizer else ByteTokenizer()


def vocabulary_size(spec: Spec) -> int:
    """How many token ids the data can hold: the teacher's vocabulary must be at least this."""
    return tokenizer_of(spec).vocab_size


def pack(documents: list[list[int]], eos: int | None, length: int) -> torch.Tensor:
    """Documents joined (each followed by `eos`, if any) and cut into rows of `length`; the rest dropped."""
    stream = [token for document in documents for token in (*document, *([] if eos is None else [eos]))]
    rows = len(stream) // length
    return torch.tensor(stream[: rows * length], dtype=torch.long).view(rows, length)


@functools.lru_cache(maxsize=2)
def _sequences(root: str, tokenizer: str | None, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed rows of seq_len + 1 tokens, the permutation that splits them), cached per process."""
    coder = LocalTokenizer(tokenizer) if tokenizer else ByteTokenizer()
    documents = [coder.encode(text) for text in read_documents(Path(root).expanduser())]
    rows = pack(documents, coder.eos, seq_len + 1)
    if len(rows) < 2:
        raise SpecError(
            f"data.root: {root} holds {sum(map(len, documents))} tokens, too few for two sequences of"
            f" {seq_len + 1}; add text or lower data.seq_len"
        )
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(SPLIT_SEED))
    return rows, order


class TextSequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Packed token sequences of one split: items (input ids, next-token labels), both of seq_len."""

    def __init__(self, rows: torch.Tensor, indices: torch.Tensor) -> None:
        self.rows, self.indices = rows, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.rows[int(self.indices[index])]
        return row[:-1], row[1:]


def build(spec: Spec, split: str) -> TextSequences:
    rows, order = _sequences(str(spec.data.root), spec.data.tokenizer, spec.data.seq_len)
    held = max(1, round(EVAL_FRACTION * len(order)))
    return TextSequences(rows, order[held:] if split == "train" else order[:held])
