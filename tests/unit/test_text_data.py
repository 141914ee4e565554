"""tier: pure logic, CPU

Text data (`data.dataset: text`): documents read from .txt and .jsonl files in path order, tokenized
as bytes (or by a local tokenizer), packed into sequences of seq_len inputs and next-token labels, and
split the same way on every build.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipebd_core.data.datasets import build_dataset
from pipebd_core.data.text import BYTE_EOS, pack, read_documents
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.workload import build_workload
from tests.transformer_specs import TINY_LLAMA, transformer_document


def text_spec(root: Path, seq_len: int = 4, **data: object) -> Spec:
    document = transformer_document(root, data={"seq_len": seq_len, **data})
    document["workload"] = {"kind": "transformer", "config": TINY_LLAMA}
    return parse_spec(document)


def test_documents_are_read_in_path_order_and_jsonl_by_line(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_text('{"text": "two"}\n\n{"text": "three"}\n')
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / "skip.csv").write_text("not text")
    assert read_documents(tmp_path) == ["one", "two", "three"]


def test_packing_joins_documents_with_an_end_token_and_drops_the_rest() -> None:
    rows = pack([[1, 2, 3], [4], [5, 6]], eos=9, length=4)
    assert rows.tolist() == [[1, 2, 3, 9], [4, 9, 5, 6]]  # the last 9 does not fill a row
    assert pack([[1, 2, 3, 4]], eos=None, length=2).tolist() == [[1, 2], [3, 4]]


def test_items_are_inputs_and_next_token_labels_and_the_split_is_fixed(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("abcdefghij" * 10)  # 100 bytes and an end token: 20 rows of 5
    spec = text_spec(tmp_path)
    train, held = build_dataset(spec), build_dataset(spec, "eval")
    assert (len(train), len(held)) == (18, 2)
    rows = [tuple(torch.cat([x, y[-1:]]).tolist()) for x, y in (train[i] for i in range(len(train)))]
    rows += [tuple(torch.cat([x, y[-1:]]).tolist()) for x, y in (held[i] for i in range(len(held)))]
    expected = pack([list(b"abcdefghij" * 10)], BYTE_EOS, 5)
    assert sorted(rows) == sorted(tuple(row) for row in expected.tolist())  # every row once, train or eval
    x, y = train[0]
    assert x.dtype == torch.long and x.shape == y.shape == (4,) and torch.equal(x[1:], y[:-1])
    other_seed = parse_spec({**spec.model_dump(), "train": {**spec.train.model_dump(), "seed": 9}})
    assert torch.equal(build_dataset(other_seed, "eval")[0][0], held[0][0])  # not the spec's seed


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "holds no .txt, .md or .jsonl files"),
        ({"a.jsonl": '{"text": "ok"}\nnot json\n'}, "a.jsonl:2 is not JSON"),
        ({"a.jsonl": '{"body": "x"}\n'}, 'a.jsonl:1 needs a "text" field'),
        ({"a.txt": "ab"}, "too few for two sequences"),
    ],
    ids=["empty", "bad-json", "no-text", "too-short"],
)
def test_bad_text_folders_are_refused_naming_the_file(files: dict[str, str], message: str, tmp_path: Path) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SpecError, match=message):
        build_dataset(text_spec(tmp_path, seq_len=8 if files else 4))


def test_a_local_tokenizer_is_used_and_its_vocabulary_checked(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["the", "cat", "sat", "on", "mat"]
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{word: i + 2 for i, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tokenizer.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("the cat sat on the mat " * 4)
    dataset = build_dataset(text_spec(tmp_path / "text", tokenizer=str(tmp_path / "tok")))
    tokens = {int(t) for i in range(len(dataset)) for t in dataset[i][0]}
    assert tokens <= set(range(2, 7)) | {0} and len(tokens) > 3
    with pytest.raises(SpecError, match=r"tokenizer\.json not found"):
        build_dataset(text_spec(tmp_path / "text", tokenizer=str(tmp_path)))
    big = Tokenizer(models.WordLevel({**vocab, **{f"w{i}": 10 + i for i in range(300)}}, unk_token="[UNK]"))
    (tmp_path / "big").mkdir()
    big.save(str(tmp_path / "big" / "tokenizer.json"))
    with pytest.raises(SpecError, match="its 307 tokens do not fit the teacher's vocabulary of 260"):
        build_workload(text_spec(tmp_path / "text", tokenizer=str(tmp_path / "big")))
