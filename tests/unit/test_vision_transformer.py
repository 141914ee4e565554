"""tier: pure logic, CPU

A torchvision vision transformer as a transformer workload's teacher: its blocks (patch embedding, encoder
layers, class-token head) compute what torchvision's own forward computes; each replacement starts from
the layer's weights as documented, checked against the definition written out with other torch calls;
a torchvision state_dict of another image size loads with its positions interpolated; a ViT trained by
kind train is torchvision's module, so its teacher.pt is such a state_dict; bad specs are refused with
what would work.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings

from pipebd_core.rank.network import as_network, network_to_train
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.candidates import Candidates
from pipebd_core.workloads.replacements import ffn_channels
from pipebd_core.workloads.vision_transformer import build_vit
from pipebd_core.workloads.workload import build_workload
from tests.transformer_specs import TINY_VIT, vit_document

SEARCH = ["keep", "ffn_1/2", "kv_2", "kv_4", "linear_attention", "no_attention", "linear", "noop"]


def vit_spec(**workload: Any) -> Spec:
    return parse_spec(vit_document(workload=workload))


def images(batch: int = 3, size: int = 16) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def searched() -> tuple[Any, list[Candidates]]:
    """A random tiny ViT's workload with every replacement as candidates, and its students."""
    workload = build_workload(vit_spec(config=TINY_VIT, replacements=SEARCH))
    students = [block for block in workload.student_blocks if isinstance(block, Candidates)]
    return workload, students


def option(students: list[Candidates], layer: int, name: str) -> nn.Module:
    return students[layer].options[students[layer].names.index(name)]


def test_the_blocks_and_head_compute_torchvisions_forward(searched: tuple[Any, list[Candidates]]) -> None:
    workload, _ = searched
    assert workload.block_names == ["layer0", "layer1", "layer2", "layer3"]
    teacher = workload.teacher_network()
    vit = build_workload(vit_spec(config=TINY_VIT)).teacher_network()  # a second build: the same seeded weights
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), vit(x), rtol=0, atol=0)
        hidden = x
        for block in workload.teacher_blocks:
            hidden = block(hidden)
            assert hidden.shape == (3, 17, 16)  # 16 patches and the class token, 16 features
    reference = _torchvision_model(teacher)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), reference(x))
    assert teacher(x).std() > 0  # a random teacher's head is drawn, not torchvision's zeros


def _torchvision_model(teacher: nn.Sequential) -> VisionTransformer:
    """A VisionTransformer of the tiny config holding the teacher blocks' weights, run by its own forward."""
    model = VisionTransformer(image_size=16, num_classes=10, **{k: v for k, v in TINY_VIT.items() if k != "model_type"})
    embedding, head = teacher[0][0], teacher[-1]
    with torch.no_grad():
        model.conv_proj.load_state_dict(embedding.conv_proj.state_dict())
        model.class_token.copy_(embedding.class_token)
        model.encoder.pos_embedding.copy_(embedding.pos_embedding)
        for i, block in enumerate([teacher[0][1], *teacher[1:-1]]):
            model.encoder.layers[i].load_state_dict(block.state_dict())
        model.encoder.ln.load_state_dict(head.norm.state_dict())
        model.heads.load_state_dict(head.heads.state_dict())
    return model.eval()


def test_keep_and_as_many_kv_heads_as_the_teacher_reproduce_the_layer(searched: tuple[Any, list[Candidates]]) -> None:
    workload, students = searched
    hidden = workload.teacher_blocks[0][0](images())
    layer = workload.teacher_blocks[0][1]
    with torch.no_grad():
        for name in ("keep", "kv_4"):
            torch.testing.assert_close(option(students, 0, name)(hidden), layer(hidden))


def test_fewer_kv_heads_attend_as_the_teacher_with_each_group_the_mean_of_its_heads(
    searched: tuple[Any, list[Candidates]],
) -> None:
    workload, students = searched
    layer = workload.teacher_blocks[1]
    reference = copy.deepcopy(layer)  # nn.MultiheadAttention whose K and V heads are the pooled ones, repeated
    attention = reference.self_attention
    with torch.no_grad():
        weight, bias = attention.in_proj_weight, attention.in_proj_bias
        for part in (1, 2):  # key, value rows of the packed projection
            rows = slice(16 * part, 16 * (part + 1))
            heads = weight[rows].view(2, 2, 4, 16).mean(1, keepdim=True).expand(2, 2, 4, 16).reshape(16, 16)
            weight[rows] = heads.clone()
            bias[rows] = bias[rows].view(2, 2, 4).mean(1, keepdim=True).expand(2, 2, 4).reshape(16).clone()
    hidden = torch.randn(3, 17, 16, generator=torch.Generator().manual_seed(1))
    student = option(students, 1, "kv_2")
    with torch.no_grad():
        torch.testing.assert_close(student(hidden), reference(hidden))
    assert student.self_attention.k_proj.weight.shape == (8, 16)  # 2 KV heads of 4 features


def test_a_narrower_ffn_keeps_the_channels_of_largest_norm(searched: tuple[Any, list[Candidates]]) -> None:
    workload, students = searched
    layer = workload.teacher_blocks[2]
    kept = ffn_channels(layer.mlp, 0.5)
    up, down = layer.mlp[0].weight, layer.mlp[3].weight
    scores = up.norm(dim=1) * down.norm(dim=0)
    assert len(kept) == 16 and set(kept.tolist()) == set(scores.topk(16).indices.tolist())
    reference = copy.deepcopy(layer)  # the teacher with the other channels' outputs zeroed
    dropped = torch.ones(32, dtype=torch.bool)
    dropped[kept] = False
    with torch.no_grad():
        reference.mlp[3].weight[:, dropped] = 0
    hidden = torch.randn(3, 17, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(option(students, 2, "ffn_1/2")(hidden), reference(hidden))


def test_linear_attention_attends_every_token_through_its_identity_feature_maps(
    searched: tuple[Any, list[Candidates]],
) -> None:
    workload, students = searched
    layer = workload.teacher_blocks[3]
    student = option(students, 3, "linear_attention")
    hidden = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(3))
    attention = layer.self_attention
    wq, wk, wv = attention.in_proj_weight.split(16)
    bq, bk, bv = attention.in_proj_bias.split(16)

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 17, 4, 4).transpose(1, 2)

    def phi(x: torch.Tensor) -> torch.Tensor:  # Hedgehog's map with W = I
        return torch.cat((x.softmax(-1), (-x).softmax(-1)), -1)

    x = layer.ln_1(hidden)
    q, k, v = heads(F.linear(x, wq, bq)), heads(F.linear(x, wk, bk)), heads(F.linear(x, wv, bv))
    scores = phi(q) @ phi(k).transpose(-1, -2)  # no causal mask: an encoder attends both ways
    attended = (scores / scores.sum(-1, keepdim=True)) @ v
    mixed = attention.out_proj(attended.transpose(1, 2).reshape(2, 17, 16)) + hidden
    expected = mixed + layer.mlp(layer.ln_2(mixed))
    with torch.no_grad():
        torch.testing.assert_close(student(hidden), expected)
    names = {name for name, _ in student.named_parameters()}
    assert {"self_attention.query_map.weight", "self_attention.key_map.weight"} <= names


def test_the_other_replacements_start_from_the_teacher(searched: tuple[Any, list[Candidates]]) -> None:
    workload, students = searched
    layer = workload.teacher_blocks[1]
    hidden = torch.randn(3, 17, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(option(students, 1, "no_attention")(hidden), hidden + layer.mlp(layer.ln_2(hidden)))
        torch.testing.assert_close(option(students, 1, "linear")(hidden), hidden)
        assert option(students, 1, "noop")(hidden) is hidden


def test_a_state_dict_of_another_image_size_loads_with_its_positions_interpolated(tmp_path: Any) -> None:
    options = {k: v for k, v in TINY_VIT.items() if k != "model_type"}
    torch.manual_seed(5)
    trained = VisionTransformer(image_size=32, num_classes=10, **options)  # 64 patches
    nn.init.normal_(trained.heads.head.weight)
    state = trained.state_dict()
    torch.save(state, tmp_path / "vit.pt")
    teacher = build_workload(vit_spec(config=TINY_VIT, teacher_weights=str(tmp_path / "vit.pt"))).teacher_network()
    expected = interpolate_embeddings(16, 4, copy.deepcopy(state))["encoder.pos_embedding"]
    torch.testing.assert_close(teacher[0][0].pos_embedding, expected)
    assert expected.shape == (1, 17, 16)
    torch.testing.assert_close(teacher[-1].heads.head.weight, state["heads.head.weight"])
    torch.testing.assert_close(teacher[2].mlp[0].weight, state["encoder.layers.encoder_layer_2.mlp.0.weight"])


def test_a_state_dict_of_another_network_is_refused_with_what_is_expected(tmp_path: Any) -> None:
    torch.save({"features.0.weight": torch.zeros(4, 3, 3, 3)}, tmp_path / "vgg.pt")
    with pytest.raises(SpecError, match=r"workload.teacher_weights: .*(missing|unexpected) keys such as .*torchvision"):
        build_workload(vit_spec(config=TINY_VIT, teacher_weights=str(tmp_path / "vgg.pt")))
    wider = VisionTransformer(image_size=16, patch_size=4, num_layers=4, num_heads=4, hidden_dim=32, mlp_dim=32)
    torch.save(wider.state_dict(), tmp_path / "wider.pt")
    with pytest.raises(SpecError, match=r"workload.teacher_weights: .*does not fit the teacher"):
        build_workload(vit_spec(config=TINY_VIT, teacher_weights=str(tmp_path / "wider.pt")))


def test_a_vision_transformer_kind_train_trains_is_torchvisions_module_in_blocks() -> None:
    document = vit_document(finetune={"strategy": "1f1b", "microbatches": 3})
    document["workload"] = {"kind": "train", "config": TINY_VIT}
    spec = parse_spec(document)
    assert spec.workload.vision_transformer and not spec.workload.language_model
    model = network_to_train(spec)
    assert isinstance(model, VisionTransformer)
    network = as_network(model)
    assert network.names == ["embedding", *(f"encoder.layers.{i}" for i in range(4)), "head"]
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(network.sequential()(x), model(x))
    assert set(model.state_dict()) == set(build_vit(spec).state_dict())  # teacher.pt: a torchvision state_dict


@pytest.mark.parametrize(
    ("workload", "data", "message"),
    [
        ({"config": TINY_VIT}, {"dataset": "text", "root": "/tmp"}, r"data.dataset: a vision transformer reads images"),
        ({"config": TINY_VIT}, {"image_size": 18}, r"data.image_size: 18 is not a multiple of the teacher's patch"),
        ({"teacher": "vit_b_16"}, {"image_size": 40}, r"data.image_size: 40 .* patch size \(16\); use 32"),
        ({"config": {**TINY_VIT, "depth": 3}}, {}, r"workload.config: unknown depth; a vision_transformer config has"),
        ({"config": {"model_type": "vision_transformer", "patch_size": 4}}, {}, r"missing num_layers"),
        ({"config": {**TINY_VIT, "image_size": 32}}, {}, r"config.image_size: 32 differs from data.image_size"),
        ({"config": TINY_VIT, "replacements": ["kv_3", "keep"]}, {}, r"kv_3: .* 4 attention heads .* divisor of 4"),
        (
            {"config": TINY_VIT, "replacements": ["keep", "noop"], "budget": {"kv_cache": 0.5}},
            {},
            r"workload.budget.kv_cache: .* keeps no KV cache.*budget params",
        ),
    ],
)
def test_bad_vision_transformer_specs_are_refused(workload: dict, data: dict, message: str) -> None:
    document = vit_document(data=data)
    document["workload"] = {"kind": "transformer", **workload}
    with pytest.raises(SpecError, match=message):
        build_workload(parse_spec(document))


def test_teacher_weights_of_a_hugging_face_teacher_are_refused() -> None:
    document = vit_document()
    document["workload"] = {"kind": "transformer", "teacher": "/models/llama", "teacher_weights": "/w.pt"}
    with pytest.raises(SpecError, match=r"teacher_weights is a torchvision state_dict, for a vision transformer"):
        parse_spec(document)


def test_a_vit_search_records_parameters_and_no_kv_cache(searched: tuple[Any, list[Candidates]]) -> None:
    workload, _ = searched
    architecture = workload.derive(workload.student_blocks, None)[0].to_json()
    assert set(architecture["reached"]) == {"params"} and "teacher_kv_cache_bytes" not in architecture
    assert all("kv_cache_bytes" not in c and c["params"] >= 0 for c in architecture["candidates"])
    assert len(architecture["candidates"]) == 4 * len(SEARCH)


@pytest.mark.parametrize("replacement", ["keep", "ffn_1/2"])
def test_a_plain_vit_student_is_a_transformers_directory_with_the_same_logits(replacement: str, tmp_path: Any) -> None:
    from transformers import ViTForImageClassification, ViTImageProcessor

    from pipebd_core.data.digits import Digits, read_digits
    from pipebd_core.workloads.transformer import rebuild
    from pipebd_core.workloads.vit_directory import write_vit_directory

    spec = vit_spec(config=TINY_VIT, replacements=[replacement])
    network = rebuild(spec)
    assert write_vit_directory(spec, network, [replacement] * TINY_VIT["num_layers"], tmp_path)
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= {p.name for p in tmp_path.iterdir()}
    model = ViTForImageClassification.from_pretrained(str(tmp_path), local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=images()).logits, network(images()), atol=1e-5, rtol=1e-5)
    # an 8-bit picture of digit 0 (its 8x8 pixels 0-16 as 0-255, resized as the data set resizes) is what it trained on
    pixels = read_digits()[0][0].reshape(8, 8) / 16.0
    big = F.interpolate(pixels[None, None], size=(16, 16), mode="bilinear", align_corners=False)[0, 0]
    picture = (big * 255).round().to(torch.uint8)[..., None].expand(16, 16, 3).numpy()
    processor = ViTImageProcessor.from_pretrained(str(tmp_path))
    values = processor(picture, return_tensors="pt", do_resize=False).pixel_values[0]
    torch.testing.assert_close(values, Digits(16, "train").images[0], atol=2e-2, rtol=0)


def test_a_vit_with_other_layers_writes_no_directory(tmp_path: Any) -> None:
    from pipebd_core.documents.architecture import Architecture, ArchitectureBlock
    from pipebd_core.workloads.transformer import rebuild
    from pipebd_core.workloads.vit_directory import write_vit_directory

    names = ["keep", "kv_2", "keep", "keep"]  # grouped KV heads: PipeBD's VisionAttention, no transformers form
    spec = vit_spec(config=TINY_VIT, replacements=["keep", "kv_2"])
    blocks = [ArchitectureBlock(block=i, layers=[name], loss=0.0, params=0) for i, name in enumerate(names)]
    network = rebuild(spec, Architecture(blocks=blocks, candidates=[], chosen_by="this test", teacher_params=0))
    assert not write_vit_directory(spec, network, names, tmp_path / "model")
    assert not (tmp_path / "model").exists()


@pytest.fixture(scope="module")
def vit_directory(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A distilled_hf directory as a ViT job writes it: the tiny ViT's `ffn_1/2` student."""
    from pipebd_core.workloads.transformer import rebuild
    from pipebd_core.workloads.vit_directory import write_vit_directory

    folder = tmp_path_factory.mktemp("distilled_hf")
    spec = vit_spec(config=TINY_VIT, replacements=["ffn_1/2"])
    assert write_vit_directory(spec, rebuild(spec), ["ffn_1/2"] * TINY_VIT["num_layers"], folder)
    return folder


def made_by_transformers(folder: Any) -> Any:
    """A ViTForImageClassification saved by transformers itself: no q/k/v bias, its own LayerNorm eps."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    options = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 24}
    config = ViTConfig(**options, image_size=16, patch_size=4, qkv_bias=False, layer_norm_eps=1e-12, num_labels=10)
    ViTForImageClassification(config).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("made_by", ["a vit job", "transformers"])
def test_a_vit_directory_is_a_teacher_whose_blocks_give_its_own_logits(
    vit_directory: Any, tmp_path: Any, made_by: str
) -> None:
    from transformers import ViTForImageClassification

    folder = vit_directory if made_by == "a vit job" else made_by_transformers(tmp_path / "vit")
    spec = parse_spec(vit_document(workload={"config": None, "teacher": str(folder)}))
    assert spec.workload.vision_transformer and not spec.workload.language_model
    workload = build_workload(spec)
    directory = ViTForImageClassification.from_pretrained(str(folder), local_files_only=True).eval()
    assert len(workload.teacher_blocks) == len(directory.vit.layers) and workload.warnings == []
    x = images()
    with torch.no_grad():
        own = directory(pixel_values=x, output_hidden_states=True)
        hidden = x
        for index, block in enumerate(workload.teacher_blocks):  # block i: the directory's layer i
            hidden = block(hidden)
            torch.testing.assert_close(hidden, own.hidden_states[index + 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(workload.teacher_network()(x), own.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported; the encoder layers use 'gelu'"),
        ({"architectures": ["ViTModel"]}, "use a ViTForImageClassification directory"),
        ({"num_channels": 1}, "num_channels is 1; the teacher reads RGB images, num_channels 3"),
        ({"auto_map": {"AutoConfig": "x.Y"}}, "auto_map"),
    ],
)
def test_a_vit_directory_the_mapping_cannot_read_is_refused_naming_the_field(
    vit_directory: Any, tmp_path: Any, change: dict, message: str
) -> None:
    import json
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(vit_directory, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    spec = parse_spec(vit_document(workload={"config": None, "teacher": str(folder)}))
    with pytest.raises(SpecError, match=r"workload\.teacher: .* is a transformers ViT directory, but") as refused:
        build_workload(spec)
    assert message in str(refused.value)
