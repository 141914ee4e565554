"""tier: pure logic, CPU

The transformer workload: teachers from local Hugging Face model directories (written here with
save_pretrained) or random configs, cut into blocks that reproduce the whole model; directories that
are not a supported model refused with what is supported; each replacement's initialisation from the
teacher's weights; the block losses.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipebd_core.data.datasets import build_dataset
from pipebd_core.rank.metrics import perplexity
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.candidates import Candidates
from pipebd_core.workloads.linear_attention import linear_attention_forward
from pipebd_core.workloads.losses import LOSSES, block_loss
from pipebd_core.workloads.replacements import ffn_channels
from pipebd_core.workloads.transformer import language_model_to_train, save_language_model
from pipebd_core.workloads.workload import build_workload
from tests.transformer_specs import TINY_GPT2, TINY_LLAMA, transformer_document, write_text


@pytest.fixture(scope="module")
def text_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text(tmp_path_factory.mktemp("text"))


def spec_of(root: Path, **workload: Any) -> Spec:
    document = transformer_document(root)
    document["workload"] = {"kind": "transformer", **workload}
    return parse_spec(document)


def save_model(config: dict[str, Any], folder: Path) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    options = {key: value for key, value in config.items() if key != "model_type"}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **options)).eval()
    model.save_pretrained(folder)
    return model


def ids(batch: int = 3, length: int = 8) -> torch.Tensor:
    return torch.randint(0, 257, (batch, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("config", [TINY_LLAMA, TINY_GPT2], ids=["llama", "gpt2"])
def test_blocks_of_a_model_directory_reproduce_the_model(
    config: dict[str, Any], text_root: Path, tmp_path: Path
) -> None:
    model = save_model(config, tmp_path / "model")
    workload = build_workload(spec_of(text_root, teacher=str(tmp_path / "model"), replacements=["keep"]))
    assert workload.teacher_network is not None and workload.assemble is not None
    x = ids()
    with torch.no_grad():
        expected = model(x).logits
        torch.testing.assert_close(workload.teacher_network()(x), expected, rtol=1e-5, atol=1e-5)
        # every student kept its teacher layer: the assembled students are the teacher
        torch.testing.assert_close(workload.assemble(workload.student_blocks)(x), expected, rtol=1e-5, atol=1e-5)
    assert workload.warnings == []
    assert workload.num_blocks == config.get("num_hidden_layers", config.get("n_layer"))


def test_the_compressed_network_is_a_causal_lm_with_the_teachers_perplexity(text_root: Path, tmp_path: Path) -> None:
    """Kept layers assemble into the teacher; finalize's perplexity is Hugging Face's own loss on the
    held-out sequences (its labels are the inputs, shifted inside the model)."""
    model = save_model(TINY_LLAMA, tmp_path / "model")
    spec = spec_of(text_root, teacher=str(tmp_path / "model"), replacements=["keep"])
    workload = build_workload(spec)
    assert workload.assemble is not None
    compressed = workload.assemble(workload.student_blocks)
    held = build_dataset(spec, "eval")
    rows = torch.stack([torch.cat([held[i][0], held[i][1][-1:]]) for i in range(len(held))])
    with torch.no_grad():
        expected = math.exp(float(model(rows, labels=rows).loss))
    assert perplexity(compressed, spec, torch.device("cpu")) == pytest.approx(expected, rel=1e-5)


def test_a_random_teacher_is_warned_and_the_same_on_every_build(text_root: Path) -> None:
    spec = spec_of(text_root, config=TINY_LLAMA)
    first, second = build_workload(spec), build_workload(spec)
    assert "randomly initialised" in first.warnings[0]
    for a, b in zip(first.teacher_blocks, second.teacher_blocks, strict=True):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(p, q), name


def write_config(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "x.Y"}}, ["own code", "llama, qwen2"]),
        ({"model_type": "bert"}, ["'bert' of", "supported families: llama, qwen2, mistral, gpt2"]),
    ],
    ids=["remote-code", "unsupported-family"],
)
def test_a_directory_that_is_not_a_supported_model_is_refused(
    config: dict[str, Any], words: list[str], text_root: Path, tmp_path: Path
) -> None:
    folder = write_config(tmp_path / "model", config)
    with pytest.raises(SpecError) as error:
        build_workload(spec_of(text_root, teacher=str(folder)))
    assert "workload.teacher" in str(error.value)
    for word in words:
        assert word in str(error.value)


def test_a_folder_without_config_or_weights_is_refused(text_root: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"no config\.json"):
        build_workload(spec_of(text_root, teacher=str(tmp_path)))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(SpecError, match=r"no \*\.safetensors"):
        build_workload(spec_of(text_root, teacher=str(tmp_path)))


@pytest.mark.parametrize(
    ("workload", "data", "message"),
    [
        ({"teacher": "x", "config": TINY_LLAMA}, {}, "give exactly one"),
        ({}, {}, "give exactly one"),
        ({"config": {"model_type": "bert"}}, {}, "use one of llama, qwen2, mistral, gpt2"),
        ({"config": TINY_LLAMA, "replacements": ["ffn_2/2"]}, {}, "not understood: ffn_2/2"),
        ({"config": TINY_LLAMA, "replacements": ["noop"]}, {}, "nothing to train"),
        ({"config": TINY_LLAMA, "replacements": ["keep", "noop"], "budget": {}}, {}, "give params, kv_cache, lat"),
        (
            {"config": TINY_LLAMA, "replacements": ["keep", "noop"], "budget": {"kv_cache": 1.5}},
            {},
            "kv_cache must be at most 1.0; got 1.5",
        ),
        ({"config": TINY_LLAMA}, {"dataset": "synthetic"}, "reads token ids"),
    ],
)
def test_bad_transformer_specs_are_refused(workload: dict, data: dict, message: str, text_root: Path) -> None:
    document = transformer_document(text_root, data=data)
    document["workload"] = {"kind": "transformer", **workload}
    with pytest.raises(SpecError, match=message):
        parse_spec(document)


@pytest.fixture(scope="module")
def llama(text_root: Path) -> tuple[Any, list[Candidates]]:
    """The tiny Llama teacher and students holding every replacement."""
    names = ["keep", "ffn_1/2", "ffn_1/4", "kv_1", "linear_attention", "no_attention", "linear", "noop"]
    workload = build_workload(spec_of(text_root, config=TINY_LLAMA, replacements=names))
    students = [s for s in workload.student_blocks if isinstance(s, Candidates)]
    assert len(students) == workload.num_blocks and workload.derive is not None and workload.assemble is None
    return workload, students


def option(student: Candidates, name: str) -> Any:
    return student.options[student.names.index(name)]


def test_a_kept_layer_reproduces_its_teacher_exactly(llama: tuple[Any, list[Candidates]]) -> None:
    workload, students = llama
    x = ids()
    with torch.no_grad():
        hidden = workload.teacher_blocks[0](x)
        assert torch.equal(option(students[1], "keep")(hidden), workload.teacher_blocks[1](hidden))
        assert torch.equal(students[0].chosen(students[0].names.index("keep"))(x), hidden)


@pytest.mark.parametrize(("name", "width"), [("ffn_1/2", 16), ("ffn_1/4", 8)])
def test_a_narrower_ffn_keeps_the_teacher_channels_of_largest_norm(
    name: str, width: int, llama: tuple[Any, list[Candidates]]
) -> None:
    workload, students = llama
    teacher = workload.teacher_blocks[2].layer.mlp
    student = option(students[2], name).layer.mlp
    kept = ffn_channels(teacher, width / 32)
    assert len(kept) == width and student.intermediate_size == width
    scores = teacher.gate_proj.weight.norm(dim=1) * teacher.up_proj.weight.norm(dim=1)
    scores *= teacher.down_proj.weight.norm(dim=0)
    assert set(kept.tolist()) == set(torch.topk(scores, width).indices.tolist())
    assert torch.equal(student.gate_proj.weight, teacher.gate_proj.weight[kept])
    assert torch.equal(student.up_proj.weight, teacher.up_proj.weight[kept])
    assert torch.equal(student.down_proj.weight, teacher.down_proj.weight[:, kept])


def test_fewer_kv_heads_are_the_means_of_the_heads_they_merge(llama: tuple[Any, list[Candidates]]) -> None:
    workload, students = llama
    teacher = workload.teacher_blocks[1].layer.self_attn
    student = option(students[1], "kv_1").layer.self_attn
    head_dim = teacher.head_dim
    for projection in ("k_proj", "v_proj"):
        weight = getattr(teacher, projection).weight
        expected = (weight[:head_dim] + weight[head_dim:]) / 2  # the two KV heads, merged into one
        torch.testing.assert_close(getattr(student, projection).weight, expected)
    assert student.num_key_value_groups == 4
    x = torch.randn(2, 8, 16)
    assert option(students[1], "kv_1")(x).shape == x.shape


def test_linear_attention_keeps_the_teachers_projections_and_attends_causally_through_its_feature_maps(
    llama: tuple[Any, list[Candidates]],
) -> None:
    workload, students = llama
    teacher = workload.teacher_blocks[2].layer.self_attn
    student = option(students[2], "linear_attention").layer.self_attn
    for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert torch.equal(getattr(student, projection).weight, getattr(teacher, projection).weight)
    assert torch.equal(student.query_map.weight, torch.eye(4).repeat(4, 1, 1))
    assert student.config._attn_implementation == "pipebd_linear" != teacher.config._attn_implementation
    with torch.no_grad():
        student.query_map.weight.add_(0.3 * torch.randn_like(student.query_map.weight))
    query, key, value = torch.randn(1, 4, 5, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    output, _ = linear_attention_forward(student, query, key, value, None)
    for head in range(4):  # query head h reads KV head h // 2 (two query heads per KV head)
        phi_q = hedgehog(query[0, head], student.query_map.weight[head])
        phi_k = hedgehog(key[0, head // 2], student.key_map.weight[head])
        for i in range(5):
            weights = phi_k[: i + 1] @ phi_q[i]
            expected = (weights / weights.sum()) @ value[0, head // 2, : i + 1]
            torch.testing.assert_close(output[0, i, head], expected)
    x = torch.randn(2, 8, 16)
    later = x.clone()
    later[:, 5] += 1.0
    block = option(students[2], "linear_attention")
    with torch.no_grad():
        assert torch.equal(block(later)[:, :5], block(x)[:, :5]) and not torch.equal(block(later), block(x))


def hedgehog(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """LoLCATs' feature map written out: [softmax(x W), softmax(-x W)]."""
    return torch.cat(((x @ weight).softmax(-1), (-(x @ weight)).softmax(-1)), dim=-1)


def test_the_other_replacements_start_from_the_teacher(llama: tuple[Any, list[Candidates]]) -> None:
    workload, students = llama
    layer = workload.teacher_blocks[3].layer
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        ffn_only = option(students[3], "no_attention")
        assert torch.equal(ffn_only(x), x + layer.mlp(layer.post_attention_layernorm(x)))
        assert torch.allclose(option(students[3], "linear")(x), x)
        assert torch.equal(option(students[3], "noop")(x), x)
    assert not list(option(students[3], "noop").parameters())
    assert all(p.requires_grad for p in ffn_only.parameters())
    assert not any(p.requires_grad for p in students[0].prefix.parameters())  # type: ignore[union-attr]


def test_a_config_field_the_family_has_not_is_refused_with_the_fields_it_has(text_root: Path) -> None:
    """A typo would otherwise be kept by Hugging Face and the family's full-size default built."""
    with pytest.raises(SpecError, match=r"hiden_size: not a field of a llama config; its fields are .*hidden_size"):
        build_workload(spec_of(text_root, config={**TINY_LLAMA, "hiden_size": 16}))


def test_block_0s_student_shares_the_teachers_frozen_embedding_and_saves_only_its_candidates(
    text_root: Path,
) -> None:
    workload = build_workload(spec_of(text_root, config=TINY_LLAMA))
    student, teacher = workload.student_blocks[0], workload.teacher_blocks[0]
    assert isinstance(student, Candidates) and isinstance(teacher, nn.Sequential)
    assert student.prefix is teacher[0] and not any(p.requires_grad for p in teacher[0].parameters())
    assert all(key.startswith("options.0.") for key in student.state_dict())
    student.to(torch.float64)  # what moves the block moves its prefix
    assert teacher[0].tokens.weight.dtype == torch.float64


def test_kv_heads_of_gpt2_are_refused_with_what_works(text_root: Path) -> None:
    with pytest.raises(SpecError, match=r"no separate KV heads.*use keep, ffn_P/Q"):
        build_workload(spec_of(text_root, config=TINY_GPT2, replacements=["kv_1"]))


def test_a_candidate_block_trains_each_candidate_as_if_alone(llama: tuple[Any, list[Candidates]]) -> None:
    """The sum of the candidates' losses gives each candidate the gradient of its own loss."""
    _, students = llama
    student, x = students[1], torch.randn(2, 8, 16)
    target = torch.randn(2, 8, 16)
    block_loss(student, LOSSES["mse"], x, target).backward()
    linear = option(student, "linear")
    together = linear.weight.grad.clone()
    linear.weight.grad = None
    LOSSES["mse"](linear(x), target).backward()
    torch.testing.assert_close(linear.weight.grad, together)
    student.zero_grad()


@pytest.mark.parametrize("loss", ["nmse", "cosine"])
def test_block_losses_of_shards_weighted_by_rows_sum_to_the_batch_loss(loss: str) -> None:
    """What lets a split batch train what the whole batch trains: each loss is a mean over rows."""
    output, target = torch.randn(5, 4, 6), torch.randn(5, 4, 6)
    whole = LOSSES[loss](output, target)
    parts = 3 / 5 * LOSSES[loss](output[:3], target[:3]) + 2 / 5 * LOSSES[loss](output[3:], target[3:])
    torch.testing.assert_close(parts, whole)
    assert float(LOSSES[loss](target, target)) == pytest.approx(0, abs=1e-6)


def test_a_server_refuses_teacher_and_tokenizer_folders_outside_its_data_roots(text_root: Path, tmp_path: Path) -> None:
    from app.core.settings import Settings
    from app.services.specs import policy_problems

    document = transformer_document(text_root, data={"tokenizer": "/etc"})
    document["workload"] = {"kind": "transformer", "teacher": "/usr/lib"}
    settings = Settings(data_roots=str(text_root.parent))
    problems = {tuple(p["loc"]): p["message"] for p in policy_problems(parse_spec(document), settings)}
    assert set(problems) == {("body", "workload", "teacher"), ("body", "data", "tokenizer")}
    assert "'/usr/lib' is outside the data roots" in problems[("body", "workload", "teacher")]


def test_a_budgeted_search_picks_the_best_choice_within_it_and_records_what_it_reached(text_root: Path) -> None:
    import itertools

    names = ["keep", "ffn_1/4", "no_attention", "noop"]
    budget = 0.5
    workload = build_workload(spec_of(text_root, config=TINY_LLAMA, replacements=names, budget={"params": budget}))
    assert workload.derive is not None
    searched, network = workload.derive(workload.student_blocks, None)
    architecture = searched.to_json()  # architecture.json as finalize writes it
    candidates = architecture["candidates"]
    per_layer = [[c for c in candidates if c["block"] == b] for b in range(workload.num_blocks)]
    teacher = architecture["teacher_params"]
    assert teacher == sum(layer[0]["params"] for layer in per_layer)  # `keep` is the teacher layer's size
    best = min(
        (sum(layer[p]["loss"] for layer, p in zip(per_layer, picks, strict=True)), picks)
        for picks in itertools.product(range(len(names)), repeat=workload.num_blocks)
        if sum(layer[p]["params"] for layer, p in zip(per_layer, picks, strict=True)) <= budget * teacher
    )
    chosen = [names.index(block["layers"][0]) for block in architecture["blocks"]]
    loss = sum(layer[p]["loss"] for layer, p in zip(per_layer, chosen, strict=True))
    assert loss == pytest.approx(best[0], rel=1e-9, abs=1e-12)  # the optimum (ties may pick another choice)
    assert architecture["budget"] == {"params": budget} and architecture["reached"]["params"] <= budget
    reached = sum(block["params"] for block in architecture["blocks"]) / teacher
    assert architecture["reached"]["params"] == pytest.approx(reached)
    assert network(ids()).shape == (3, 8, TINY_LLAMA["vocab_size"])


def test_a_kv_cache_budget_with_a_parameter_budget_picks_the_best_choice_within_both(text_root: Path) -> None:
    """KV heads of 4 floats, two per layer: keep and ffn_1/4 cache 64 bytes a token, kv_1 32, linear attention
    none (and holds more parameters than the teacher layer, its feature maps)."""
    import itertools

    names = ["keep", "ffn_1/4", "kv_1", "linear_attention"]
    budget = {"params": 0.9, "kv_cache": 0.4}
    workload = build_workload(spec_of(text_root, config=TINY_LLAMA, replacements=names, budget=budget))
    assert workload.derive is not None
    architecture = workload.derive(workload.student_blocks, None)[0].to_json()
    per_layer = [[c for c in architecture["candidates"] if c["block"] == b] for b in range(workload.num_blocks)]
    assert [c["kv_cache_bytes"] for c in per_layer[1]] == [64, 64, 32, 0]
    assert architecture["teacher_kv_cache_bytes"] == 4 * 64
    assert per_layer[1][3]["params"] > per_layer[1][0]["params"] == architecture["teacher_params"] / 4
    teacher = {"params": architecture["teacher_params"], "kv_cache": architecture["teacher_kv_cache_bytes"]}

    def within(picks: tuple[int, ...]) -> bool:
        return all(
            sum(layer[p][cost] for layer, p in zip(per_layer, picks, strict=True)) <= bound * teacher[name]
            for name, cost, bound in (("params", "params", 0.9), ("kv_cache", "kv_cache_bytes", 0.4))
        )

    best = min(
        sum(layer[p]["loss"] for layer, p in zip(per_layer, picks, strict=True))
        for picks in itertools.product(range(len(names)), repeat=workload.num_blocks)
        if within(picks)
    )
    chosen = tuple(names.index(block["layers"][0]) for block in architecture["blocks"])
    assert within(chosen) and sum(layer[p]["loss"] for layer, p in zip(per_layer, chosen, strict=True)) == (
        pytest.approx(best, rel=1e-9, abs=1e-12)
    )
    assert architecture["budget"] == budget and architecture["reached"]["kv_cache"] <= 0.4
    reached = sum(block["kv_cache_bytes"] for block in architecture["blocks"]) / teacher["kv_cache"]
    assert architecture["reached"]["kv_cache"] == pytest.approx(reached)


@pytest.mark.parametrize(
    ("replacements", "budget", "message"),
    [
        (
            ["keep", "ffn_1/2"],
            {"kv_cache": 0.5},
            r"workload.budget.kv_cache: 0.5 .* can reach \(1\.000.*linear_attention",
        ),
        (["keep", "ffn_1/2", "linear_attention"], {"params": 0.8, "kv_cache": 0.5}, r"no one choice .* meets them all"),
    ],
)
def test_kv_cache_budgets_no_choice_meets_are_refused_before_launch(
    replacements: list[str], budget: dict[str, float], message: str, text_root: Path
) -> None:
    spec = spec_of(text_root, config=TINY_LLAMA, replacements=replacements, budget=budget)
    with pytest.raises(SpecError, match=message):
        build_workload(spec)


def test_a_budget_no_choice_meets_is_refused_before_launch_with_the_smallest_reachable(text_root: Path) -> None:
    spec = spec_of(text_root, config=TINY_LLAMA, replacements=["keep", "ffn_1/2"], budget={"params": 0.3})
    with pytest.raises(SpecError, match=r"workload.budget.params: 0.3 .* can reach \(0\.[0-9]+"):
        build_workload(spec)


def test_a_budget_without_a_search_is_refused(text_root: Path) -> None:
    with pytest.raises(SpecError, match="a budget chooses among a transformer search's candidates"):
        spec_of(text_root, config=TINY_LLAMA, replacements=["ffn_1/2"], budget={"params": 0.5})


def test_a_searched_network_is_rebuilt_from_its_state_dict_and_choices_and_exported_as_a_program(
    text_root: Path, tmp_path: Path
) -> None:
    """What finalize writes for a transformer job: distilled_state.pt with architecture.json rebuild the
    network in PipeBD; distilled_model.pt2 runs it alone, at other batch sizes and lengths."""
    from pipebd_core.documents.architecture import Architecture
    from pipebd_core.workloads.transformer import rebuild

    names = ["keep", "kv_1", "linear_attention"]  # 64, 32 and 0 KV bytes a token: 76.8 of 256 needs linear ones
    spec = spec_of(text_root, config=TINY_LLAMA, replacements=names, budget={"kv_cache": 0.3})
    workload = build_workload(spec)
    assert workload.derive is not None and workload.export is not None
    with torch.no_grad():  # trained students differ from their initialisation
        for student in workload.student_blocks:
            for parameter in student.parameters():
                if parameter.requires_grad:
                    parameter.add_(0.05 * torch.randn_like(parameter))
    architecture, network = workload.derive(workload.student_blocks, None)
    assert [block.layers[0] for block in architecture.blocks].count("linear_attention") >= 2
    torch.save(network.state_dict(), tmp_path / "distilled_state.pt")
    workload.export(network, tmp_path / "distilled_model.pt2")
    written = Architecture.from_json(json.loads(json.dumps(architecture.to_json())))
    rebuilt = rebuild(spec, written)
    rebuilt.load_state_dict(torch.load(tmp_path / "distilled_state.pt"))
    program = torch.export.load(tmp_path / "distilled_model.pt2").module()
    with torch.no_grad():
        for shape in ((3, 8), (1, 5)):
            x = torch.randint(0, 257, shape)
            expected = network(x)
            assert torch.equal(rebuilt(x), expected)
            torch.testing.assert_close(program(x), expected)
    with pytest.raises(SpecError, match=r"rebuilt from its architecture\.json"):
        rebuild(spec)


def test_a_search_by_logits_kl_scores_each_candidate_swapped_into_the_teacher(text_root: Path) -> None:
    """workload.search_loss logits_kl: a candidate's loss is KL(teacher || teacher with that layer swapped for
    it) of the next-token distributions on held-out tokens; the kept layer scores 0, and the choice follows."""
    from pipebd_core.workloads.transformer import held_out_ids

    names = ["keep", "ffn_1/4", "noop"]
    spec = spec_of(text_root, config=TINY_LLAMA, replacements=names, search_loss="logits_kl", budget={"params": 0.6})
    workload = build_workload(spec)
    assert workload.derive is not None and workload.teacher_network is not None
    architecture = workload.derive(workload.student_blocks, None)[0]
    assert architecture.candidates is not None and architecture.chosen_by is not None
    assert "KL of the teacher's logits" in architecture.chosen_by
    teacher = workload.teacher_network()
    assert isinstance(teacher, nn.Sequential)
    ids = held_out_ids(spec)
    with torch.no_grad():
        log_p = teacher(ids).log_softmax(-1).flatten(0, -2)
        for candidate in architecture.candidates:
            student = workload.student_blocks[candidate.block]
            assert isinstance(student, Candidates)
            swapped = list(teacher)
            swapped[candidate.block] = student.chosen(student.names.index(candidate.name))
            log_q = nn.Sequential(*swapped)(ids).log_softmax(-1).flatten(0, -2)
            expected = float((log_p.exp() * (log_p - log_q)).sum(-1).mean())
            assert candidate.loss == pytest.approx(expected, rel=1e-4, abs=1e-7)
        kept = {c.block: c.loss for c in architecture.candidates if c.name == "keep"}
        assert all(loss == pytest.approx(0, abs=1e-9) for loss in kept.values())
        assert all(c.loss > kept[c.block] for c in architecture.candidates if c.name != "keep"), architecture.candidates
    layers = [[c for c in architecture.candidates if c.block == block.block] for block in architecture.blocks]
    limit = 0.6 * (architecture.teacher_params or 0)
    within = [pick for pick in itertools.product(*layers) if sum(c.params for c in pick) <= limit]
    best = min(within, key=lambda pick: sum(c.loss for c in pick))  # the brute-force choice on these losses
    assert [block.layers[-1] for block in architecture.blocks] == [c.name for c in best]
    with pytest.raises(SpecError, match="'logits_kl' measures a transformer search's candidates"):
        spec_of(text_root, config=TINY_LLAMA, replacements=["ffn_1/2"], search_loss="logits_kl")


@pytest.mark.parametrize(
    ("workload", "data", "message"),
    [
        ({"kind": "train", "teacher": "vgg11", "config": TINY_LLAMA}, {}, "a language model of a config; give one"),
        (
            {"kind": "train", "config": TINY_LLAMA},
            {"dataset": "digits"},
            r"trains on token ids; use 'text', not 'digits'",
        ),
        (
            {"kind": "train", "teacher": "vgg11"},
            {},
            r"'text' yields token ids for kind 'transformer' \(or kind 'train'",
        ),
        ({"kind": "compression", "config": TINY_LLAMA}, {}, "kind 'compression' has none, remove it"),
    ],
)
def test_a_language_model_to_train_needs_a_config_and_text(
    workload: dict, data: dict, message: str, text_root: Path
) -> None:
    document = transformer_document(text_root, data=data)
    document["workload"] = workload
    document["finetune"] = {"strategy": "ddp", "profile": False}
    with pytest.raises(SpecError, match=message):
        parse_spec(document)


def test_a_language_model_trained_from_a_config_is_every_layer_trainable_and_saves_as_a_model_directory(
    text_root: Path, tmp_path: Path
) -> None:
    document = transformer_document(text_root)
    document["workload"] = {"kind": "train", "config": TINY_LLAMA}
    document["finetune"] = {"strategy": "ddp", "profile": False}
    spec = parse_spec(document)
    network = language_model_to_train(spec)
    assert len(network) == 6 and all(p.requires_grad for p in network.parameters())  # embedding, 4 layers, head
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(0.01)  # "trained": no longer the random model the config seeds
    save_language_model(spec, network.state_dict(), tmp_path / "model")
    loaded = build_workload(spec_of(text_root, teacher=str(tmp_path / "model"))).teacher_network
    assert loaded is not None
    ids = torch.randint(0, 257, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded()(ids), network.eval()(ids))
