"""Transformer workload: distil a Hugging Face decoder language model, or a vision transformer, layer by layer.

The teacher is a local model directory (config.json and safetensors weights, read with local files
only and without remote code; a directory of PipeBD's own layers, as a search writes, is built by PipeBD's
own copy of its modeling code: pipebd_teacher.py) or a random model built from `workload.config`; or a
torchvision vision transformer (vision_transformer.py: images in, class logits out, the rest as here).
Blocks are its decoder layers: block 0 embeds the token ids first (its student shares the teacher's frozen
embedding), and the final norm and the LM head follow the last block (in the assembled network only). A block takes
and returns hidden states (batch, tokens, hidden): the causal mask, the positions and the rotary
embeddings are recomputed in every block from the sequence length (packed sequences have no padding),
so only the hidden state is relayed between ranks.

Every block's student holds the candidates of `workload.replacements` (replacements.py), trained side by
side against the same teacher output: one candidate compresses, several search (the lowest held-out loss
per layer is chosen; a budget is not applied yet). Dropout is switched off in teacher and students.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipebd_core.documents.architecture import Architecture
from pipebd_core.documents.profile import Profile
from pipebd_core.spec import TRANSFORMER_FAMILIES, Spec, SpecError
from pipebd_core.workloads.candidates import Candidates, replaced_layer
from pipebd_core.workloads.library import (
    MEASURES,
    Costs,
    Library,
    check_fractions,
    choose_from,
    chosen_architecture,
)
from pipebd_core.workloads.remote_format import MODEL_TYPE
from pipebd_core.workloads.replacements import build_replacement
from pipebd_core.workloads.transformer_parts import ModelParts
from pipebd_core.workloads.workload import Workload, block_seed

DROPOUTS = ("attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout")
DERIVE_SAMPLES = 16  # held-out sequences on which a search measures every candidate's loss
_FIELD = "workload.teacher"


class TokenEmbedding(nn.Module):
    """Token ids to block 0's hidden states: the token embedding, plus learned positions (GPT-2)."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Embedding | None) -> None:
        super().__init__()
        self.tokens, self.positions = tokens, positions

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(ids.long())
        if self.positions is not None:
            hidden = hidden + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return hidden


class DecoderBlock(nn.Module):
    """One decoder layer as a block: hidden states in and out, causal, positions 0..T-1 (rotary
    embeddings computed here from the sequence length where the family has them)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.rotary is None:
            output = self.layer(hidden, attention_mask=None)
        else:
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            rotary = self.rotary(hidden, positions)
            output = self.layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        return output[0] if isinstance(output, tuple) else output


class LMHead(nn.Module):
    """After the last block: the final norm and the projection to the vocabulary."""

    def __init__(self, norm: nn.Module, projection: nn.Module) -> None:
        super().__init__()
        self.norm, self.projection = norm, projection

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.projection(self.norm(hidden))


def split_model(model: Any) -> ModelParts:
    """The embedding, decoder layers, rotary embedding and head of a supported causal LM."""
    config: Any = model.config
    if config.model_type == MODEL_TYPE:
        from pipebd_core.workloads.pipebd_teacher import split_pipebd_model

        return split_pipebd_model(model)
    if config.model_type == "gpt2":
        body: Any = model.transformer
        embedding = TokenEmbedding(body.wte, body.wpe)
        head = LMHead(body.ln_f, model.lm_head)
        return ModelParts(embedding, list(body.h), head, config.hidden_size, lambda layer: DecoderBlock(layer, None))
    body = model.model
    embedding = TokenEmbedding(body.embed_tokens, None)
    head = LMHead(body.norm, model.lm_head)
    rotary = body.rotary_emb
    return ModelParts(
        embedding, list(body.layers), head, config.hidden_size, lambda layer: DecoderBlock(layer, copy.deepcopy(rotary))
    )


def read_model_config(folder: str) -> dict[str, Any]:
    """config.json of a local model directory, refused unless it is a supported family without remote code."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise SpecError(f"{_FIELD}: {path} is not a Hugging Face model directory (no config.json there)")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SpecError(f"{_FIELD}: {path}/config.json cannot be read: {error}") from None
    if not isinstance(config, dict):
        raise SpecError(f"{_FIELD}: {path}/config.json is not a JSON object")
    if config.get("model_type") == MODEL_TYPE:
        from pipebd_core.workloads.pipebd_teacher import read_pipebd_config

        read_pipebd_config(path, config)
    elif "auto_map" in config:
        raise SpecError(
            f"{_FIELD}: {path} needs its own code (auto_map in config.json), which is never run here; use a"
            " model of a supported family: " + ", ".join(TRANSFORMER_FAMILIES)
        )
    if config.get("model_type") not in (*TRANSFORMER_FAMILIES, MODEL_TYPE):
        raise SpecError(
            f"{_FIELD}: model_type {config.get('model_type')!r} of {path} is not supported; supported families: "
            + ", ".join(TRANSFORMER_FAMILIES)
        )
    if not any(path.glob("*.safetensors")):
        raise SpecError(f"{_FIELD}: {path} has no *.safetensors weights (save them with safe_serialization)")
    return config


def _quiet(config: Any) -> Any:
    """The config without dropout and with PyTorch's fused causal attention (masks built from lengths)."""
    for name in DROPOUTS:
        if hasattr(config, name):
            setattr(config, name, 0.0)
    config._attn_implementation = "sdpa"
    return config


def family_config(fields: dict[str, Any]) -> Any:
    """The Hugging Face config `workload.config` describes; a field the family does not have is refused
    (Hugging Face would keep it and silently build the family's full-size default instead)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    family = fields["model_type"]
    options = {key: value for key, value in fields.items() if key != "model_type"}
    known = set(CONFIG_MAPPING[family]().to_dict()) | set(getattr(CONFIG_MAPPING[family], "attribute_map", {}))
    unknown = sorted(set(options) - known)
    if unknown:
        raise SpecError(
            f"workload.config: {', '.join(unknown)}: not a field of a {family} config; its fields are "
            + ", ".join(sorted(known - {"model_type", "transformers_version"}))
        )
    try:
        return _quiet(AutoConfig.for_model(family, **options))
    except (TypeError, ValueError) as error:
        raise SpecError(f"workload.config: not a valid {family} config: {error}") from None


def load_teacher(spec: Spec) -> tuple[nn.Module, list[str]]:
    """The teacher causal LM, in float32 on CPU, and the warnings it comes with."""
    from transformers import AutoConfig, AutoModelForCausalLM  # seconds to import: only where a job needs it

    w = spec.workload
    if w.config is not None:
        config = family_config(w.config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(block_seed(spec.train.seed, "teacher", 0))
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        warning = (
            f"the {w.config['model_type']} teacher is randomly initialised from workload.config, so distillation"
            " mimics random features; set workload.teacher to a model directory for a real teacher"
        )
        return model, [warning]
    if read_model_config(w.teacher).get("model_type") == MODEL_TYPE:
        from pipebd_core.workloads.pipebd_teacher import load_pipebd_model

        return load_pipebd_model(Path(w.teacher).expanduser()), []
    folder = str(Path(w.teacher).expanduser())
    local = {"local_files_only": True, "trust_remote_code": False}
    config = _quiet(AutoConfig.from_pretrained(folder, **local))
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=torch.float32, use_safetensors=True, **local
        )
    except (OSError, ValueError, RuntimeError) as error:
        raise SpecError(f"{_FIELD}: cannot load the model in {folder}: {error}") from None
    return model, []


def check_fits_data(config: Any, spec: Spec) -> None:
    """Refuse sequences the teacher cannot take, and tokens outside its vocabulary."""
    seq_len, window = spec.data.seq_len, getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and seq_len > window:
        raise SpecError(
            f"data.seq_len: {seq_len} exceeds the teacher's sliding window ({window}), which blocks do not"
            f" apply; use a seq_len of at most {window}"
        )
    gpt2 = config.model_type == "gpt2" or getattr(config, "family", None) == "gpt2"
    if gpt2 and seq_len > config.max_position_embeddings:
        raise SpecError(
            f"data.seq_len: {seq_len} exceeds the teacher's {config.max_position_embeddings} positions;"
            f" use at most {config.max_position_embeddings}"
        )
    if spec.data.dataset == "text":
        from pipebd_core.data.text import vocabulary_size

        needed = vocabulary_size(spec)
        if needed > config.vocab_size:
            raise SpecError(
                f"data.tokenizer: its {needed} tokens do not fit the teacher's vocabulary of {config.vocab_size};"
                " use the teacher's own tokenizer folder, or a teacher with a larger vocab_size"
            )


def _student(parts: ModelParts, index: int, names: Sequence[str]) -> Candidates:
    layer = parts.layers[index]
    options = [build_replacement(name, layer, parts.hidden_size, parts.block) for name in names]
    for option in options:
        option.requires_grad_(True)
    return Candidates(names, options, parts.embedding if index == 0 else None)


def kv_cache_bytes(block: nn.Module) -> int:
    """The bytes a block adds to a decoder's KV cache per token: its attention's keys and values, one per KV
    head; none for linear attention (a state of fixed size) or for a block without attention."""
    layer = getattr(block, "layer", None)
    attention = getattr(layer, "self_attn", None) or getattr(layer, "attn", None)
    if attention is None or hasattr(attention, "query_map"):
        return 0
    config = attention.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(attention, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * heads * head_dim * next(attention.parameters()).element_size()


def network_costs(network: nn.Module) -> tuple[int, int]:
    """A language model's parameters (all of them) and the bytes its attention layers add to the KV cache per
    token (summed over its decoder blocks, as kv_cache_bytes counts one)."""
    params = sum(p.numel() for p in network.parameters())
    return params, sum(kv_cache_bytes(module) for module in network.modules() if hasattr(module, "layer"))


def candidate_costs(students: Sequence[nn.Module]) -> dict[str, list[list[int]]]:
    """Per cost, per layer, each candidate's: its parameters (block 0's shared embedding is the teacher's:
    not counted) and its KV-cache bytes per token."""
    costs: dict[str, list[list[int]]] = {"params": [], "kv_cache": []}
    for student in students:
        assert isinstance(student, Candidates)
        costs["params"].append([sum(p.numel() for p in option.parameters()) for option in student.options])
        costs["kv_cache"].append([kv_cache_bytes(option) for option in student.options])
    return costs


def teacher_costs(teachers: Sequence[nn.Module]) -> dict[str, float]:
    """The teacher's layers' costs, which a budget's fractions are of."""
    layers = [replaced_layer(teacher) for teacher in teachers]
    return {
        "params": sum(p.numel() for layer in layers for p in layer.parameters()),
        "kv_cache": sum(kv_cache_bytes(layer) for layer in layers),
    }


def latency_costs(profile: Profile | None) -> tuple[list[list[float]], float] | None:
    """Per layer each candidate's forward seconds as the profile phase measured them on the job's device,
    and the teacher's layers' summed; None where the profile has no such timings."""
    blocks = profile.blocks if profile is not None else []
    if not blocks or not all(block.candidate_forward_s and block.layer_forward_s for block in blocks):
        return None
    candidates = [[timing.median for timing in block.candidate_forward_s] for block in blocks]
    return candidates, sum(block.layer_forward_s.median for block in blocks if block.layer_forward_s)


def search_costs(
    students: Sequence[nn.Module], teachers: Sequence[nn.Module], profile: Profile | None
) -> tuple[Costs, dict[str, float]]:
    """Every cost of every candidate and the teacher's: parameters and KV cache, and where the profile
    measured them, forward latency."""
    costs: Costs = dict(candidate_costs(students))
    teacher = teacher_costs(teachers)
    measured = latency_costs(profile)
    if measured is not None:
        costs["latency"], teacher["latency"] = measured
    return costs, teacher


def check_budget(spec: Spec, costs: Costs, teacher: dict[str, float]) -> None:
    """Refuse a budget that no choice of one candidate per layer meets (library.py: each bound alone, naming
    the smallest fraction the replacements reach, then all of them at once). Before launch without latency,
    at the plan phase with it (check_latency_budget)."""
    if spec.workload.budget is not None:
        check_fractions(spec.workload.budget, costs, teacher)


def no_timings() -> SpecError:
    return SpecError(
        "workload.budget.latency: the profile has no candidate timings (a profile measured before they were"
        " taken); profile again (pipebd profile SPEC --refresh), or budget params or kv_cache instead"
    )


def check_latency_budget(spec: Spec, profile: Profile | None) -> None:
    """The plan phase's check of a latency budget, once the profile has measured every candidate: refused,
    before distillation, where no choice meets it with the rest of the budget."""
    budget = spec.workload.budget
    if budget is None or budget.latency is None:
        return
    if latency_costs(profile) is None:
        raise no_timings()
    workload = build_transformer_workload(spec)
    check_budget(spec, *search_costs(workload.student_blocks, workload.teacher_blocks, profile))


def _derive(
    spec: Spec, teachers: Sequence[nn.Module], head: nn.Module
) -> Callable[[Sequence[nn.Module], Profile | None], tuple[Architecture, nn.Module]]:
    """A search's choice: per layer the candidate of lowest loss on held-out sequences, or with
    `workload.budget` the choice of lowest summed loss within it (library.py, the one place a choice is made,
    now or later for another budget); architecture.json has every candidate's loss and costs, and the
    network of the chosen candidates."""

    def derive(blocks: Sequence[nn.Module], profile: Profile | None) -> tuple[Architecture, nn.Module]:
        students = [block for block in blocks if isinstance(block, Candidates)]
        assert len(students) == len(blocks), "every student block of a transformer search holds candidates"
        measure = swapped_logits_kl if spec.workload.search_loss == "logits_kl" else held_out_losses
        losses = measure(spec, teachers, students, head)
        costs, teacher = search_costs(students, teachers, profile)
        budget = spec.workload.budget
        if budget is not None and budget.latency is not None and "latency" not in costs:
            raise no_timings()
        library = Library(
            [list(student.names) for student in students], losses, costs, teacher, MEASURES[spec.workload.search_loss]
        )
        picks, chosen_by = choose_from(library, budget)
        chosen = [student.chosen(pick) for student, pick in zip(students, picks, strict=True)]
        return chosen_architecture(library, picks, budget, chosen_by), nn.Sequential(*chosen, head).eval()

    return derive


def held_out_ids(spec: Spec) -> torch.Tensor:
    """The first DERIVE_SAMPLES held-out sequences of token ids, on which a search measures its candidates."""
    from pipebd_core.data.datasets import build_dataset

    dataset = build_dataset(spec, "eval")
    return torch.stack([dataset[i][0] for i in range(min(DERIVE_SAMPLES, len(dataset)))])  # type: ignore[arg-type]


def held_out_losses(
    spec: Spec, teachers: Sequence[nn.Module], students: Sequence[Candidates], _head: nn.Module
) -> list[list[float]]:
    """Per layer, each candidate's loss against its teacher layer on held-out sequences (teacher-relayed)."""
    from pipebd_core.workloads.losses import LOSSES

    x = held_out_ids(spec)
    losses = []
    with torch.no_grad():
        for teacher, student in zip(teachers, students, strict=True):
            target = teacher(x)
            losses.append(student.candidate_losses(x, target, LOSSES[spec.train.loss]).tolist())
            x = target
    return losses


def swapped_logits_kl(
    spec: Spec, teachers: Sequence[nn.Module], students: Sequence[Candidates], head: nn.Module
) -> list[list[float]]:
    """Per layer, each candidate's KL(teacher || teacher with that layer swapped for the candidate) of the
    next-token distributions on held-out sequences, the mean over tokens (Puzzle's replace-one-block score)."""
    x = held_out_ids(spec)
    inputs = []
    with torch.no_grad():
        for teacher in teachers:
            inputs.append(x)
            x = teacher(x)
        log_p = head(x).log_softmax(-1).flatten(0, -2)
        losses = []
        for layer, student in enumerate(students):
            row = []
            for index in range(len(student.names)):
                hidden = student.chosen(index)(inputs[layer])
                for teacher in teachers[layer + 1 :]:
                    hidden = teacher(hidden)
                log_q = head(hidden).log_softmax(-1).flatten(0, -2)
                row.append(float(F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)))
            losses.append(row)
    return losses


def export_program(network: nn.Module, seq_len: int, path: Path) -> None:
    """distilled_model.pt2: `torch.export.load(path).module()(ids)` gives the logits of token ids
    (batch, tokens) of any batch size and length (up to the teacher's positions), without PipeBD."""
    example = torch.zeros(2, max(seq_len, 2), dtype=torch.long)  # sizes of 1 would be frozen in
    dynamic = ({0: torch.export.Dim("batch", min=1), 1: torch.export.Dim("tokens", min=2)},)
    program = torch.export.export(network.cpu().eval(), (example,), dynamic_shapes=dynamic)
    torch.export.save(program, path)


def rebuild(spec: Spec, architecture: Architecture | None = None) -> nn.Module:
    """The distilled network of a transformer job, built again from its spec and, for a search, the
    choices of its architecture.json, ready for `load_state_dict(torch.load(distilled_state.pt))`."""
    if architecture is None:
        if len(spec.workload.replacements) > 1:
            raise SpecError("a search's network is rebuilt from its architecture.json: pass its choices")
        return first_candidates(spec)
    choices = [block.layers[0] for block in architecture.blocks]
    return _assembled(spec, lambda layer, student: student.names.index(choices[layer]))


def first_candidates(spec: Spec) -> nn.Module:
    """The network of every layer's first candidate (a search's shapes, before it has chosen)."""
    return _assembled(spec, lambda layer, student: 0)


def _assembled(spec: Spec, pick: Callable[[int, Candidates], int]) -> nn.Module:
    """The teacher's head after, per layer, the candidate `pick(layer, candidates)` of a fresh workload."""
    workload = build_transformer_workload(spec)
    students = [block for block in workload.student_blocks if isinstance(block, Candidates)]
    chosen = [student.chosen(pick(layer, student)) for layer, student in enumerate(students)]
    assert workload.teacher_network is not None, "a transformer workload has its teacher network"
    teacher = workload.teacher_network()
    assert isinstance(teacher, nn.Sequential), "the teacher network is its blocks, then the head"
    return nn.Sequential(*chosen, teacher[-1]).eval()


def language_model_to_train(spec: Spec) -> nn.Module:
    """kind train with a config: the random causal LM of `workload.config` as layers to train end to end
    (embedding, every decoder layer, final norm and head), seeded as the transformer workload's teacher."""
    return _trainable(spec)[1]


def save_language_model(spec: Spec, state: dict[str, torch.Tensor], folder: Path) -> None:
    """The trained layers of `language_model_to_train` as a Hugging Face model directory that `workload.teacher`
    of a transformer job loads, with the data's special tokens and tokenizer (hf_directory.py)."""
    from pipebd_core.workloads.hf_directory import save_model_directory  # it imports this module

    model, network = _trainable(spec)
    network.load_state_dict(state)  # the layers are the model's own modules: its weights now
    save_model_directory(spec, model, folder)


def _trainable(spec: Spec) -> tuple[Any, nn.Module]:
    model, _ = load_teacher(spec)  # its warning is a distillation's: here the random model is what trains
    check_fits_data(model.config, spec)
    parts = split_model(model)
    layers = [parts.block(layer) for layer in parts.layers]
    return model, nn.Sequential(parts.embedding, *layers, parts.head).train()


def teacher_parts(spec: Spec) -> tuple[ModelParts, list[str]]:
    """The teacher cut into its parts (a Hugging Face causal LM's, or a torchvision vision transformer's,
    vision_transformer.py), and the warnings it comes with."""
    if spec.workload.vision_transformer:
        from pipebd_core.workloads.vision_transformer import load_vit, split_vit

        vit, warnings = load_vit(spec)
        return split_vit(vit), warnings
    from pipebd_core.workloads.hf_directory import check_exportable  # it imports this module

    model, warnings = load_teacher(spec)
    check_fits_data(model.config, spec)
    check_exportable(spec, model.config)
    return split_model(model), warnings


def _exporter(spec: Spec) -> Callable[[nn.Module, Path], None]:
    if spec.workload.vision_transformer:
        from pipebd_core.workloads import vision_transformer

        return lambda network, path: vision_transformer.export_program(network, spec.data.image_size, path)
    return lambda network, path: export_program(network, spec.data.seq_len, path)


def _hf_directory(spec: Spec) -> Callable[[nn.Module, Architecture | None, Path], None] | None:
    """A language model's network as a Hugging Face model directory (hf_directory.py); a vision transformer's
    where it is a plain torchvision ViT (vit_directory.py)."""
    if spec.workload.vision_transformer:

        def write_vit(network: nn.Module, architecture: Architecture | None, folder: Path) -> None:
            from pipebd_core.workloads.vit_directory import vit_layer_names, write_vit_directory

            write_vit_directory(spec, network, vit_layer_names(spec, network, architecture), folder)

        return write_vit

    def write(network: nn.Module, architecture: Architecture | None, folder: Path) -> None:
        from pipebd_core.workloads.hf_directory import layer_names, write_model_directory

        write_model_directory(spec, network, layer_names(spec, architecture), folder)

    return write


def build_transformer_workload(spec: Spec) -> Workload:
    parts, warnings = teacher_parts(spec)
    names = spec.workload.replacements
    teachers: list[nn.Module] = [parts.block(layer) for layer in parts.layers]
    teachers[0] = nn.Sequential(parts.embedding, teachers[0])
    students: list[nn.Module] = [_student(parts, i, names) for i in range(len(parts.layers))]
    head = parts.head.eval().requires_grad_(False)
    check_budget(spec, *search_costs(students, teachers, None))

    def assemble(blocks: Sequence[nn.Module]) -> nn.Module:
        return nn.Sequential(*(block.chosen(0) for block in blocks if isinstance(block, Candidates)), head).eval()

    search = len(names) > 1
    return Workload(
        teacher_blocks=teachers,
        student_blocks=students,
        block_names=[f"layer{i}" for i in range(len(teachers))],
        assemble=None if search else assemble,
        teacher_network=lambda: nn.Sequential(*teachers, head).eval(),
        warnings=warnings,
        derive=_derive(spec, teachers, head) if search else None,
        export=_exporter(spec),
        hf_directory=_hf_directory(spec),
    )
