"""The ready configs in configs/ and the tokenizer + dataset shipped in titan_rocm/assets.

Everything goes through TorchTitan 0.2.2's own code: ``ConfigManager`` parses each file,
``build_hf_tokenizer`` loads the tokenizer, ``build_text_dataloader`` reads the dataset,
and each model is built on the meta device from its train spec.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import titan_rocm  # noqa: F401  (registers the rocm converters, as custom_import does)

REPO = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO / "configs"
ASSETS_DIR = REPO / "titan_rocm" / "assets"
DOC = REPO / "docs" / "configs.md"

FULL_SIZE = (
    "llama3_8b_bf16.toml",
    "qwen3_32b_bf16.toml",
    "deepseek_v3_16b_bf16.toml",
    "deepseek_v3_16b_fp8.toml",
)
DEBUG = (
    "llama3_debug.toml",
    "qwen3_debug.toml",
    "qwen3_moe_debug.toml",
    "deepseek_v3_debug.toml",
    "deepseek_v3_debug_fp8.toml",
)
FP8 = ("deepseek_v3_16b_fp8.toml", "deepseek_v3_debug_fp8.toml")
FP8_CONVERTERS = ["rocm", "quantize.linear.float8", "quantize.grouped_mm.float8"]
# [rocm] values that differ from RocmSettings() defaults, each with its reason in the file.
ROCM_OVERRIDES: dict[str, dict[str, Any]] = {
    # torchao's float8 experts intercept torch._grouped_mm; another backend bypasses them.
    name: {"grouped_mm_backend": "torch"}
    for name in FP8
}

# Keys a titan-rocm config adds to its TorchTitan reference, and keys it may change.
ADDED_KEYS = {
    "job.custom_config_module",
    "experimental.custom_import",
    "model.converters",
    "training.mixed_precision_param",
    "training.mixed_precision_reduce",
    "training.dataset_path",
}
CHANGED_EVERYWHERE = {
    "job.description",
    "metrics.disable_color_printing",
    "compile.enable",
}
CHANGED_IN_DEBUG = {"model.hf_assets_path", "training.steps"}
CHANGED_IN = {
    "qwen3_debug.toml": {"model.flavor"},  # 0.2.2 has no TOML for the dense debug flavor
    "deepseek_v3_16b_bf16.toml": {"compile.components"},  # TorchTitan's: ["loss"] only
    "deepseek_v3_16b_fp8.toml": {"compile.components"},
}


def all_configs() -> list[str]:
    return sorted(p.name for p in CONFIGS_DIR.glob("*.toml"))


def raw(name: str) -> dict[str, Any]:
    with open(CONFIGS_DIR / name, "rb") as f:
        return tomllib.load(f)


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse(name: str):
    """The job config exactly as ``torchtitan.train`` would build it from the file."""
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", str(CONFIGS_DIR / name)])


@pytest.fixture
def in_repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Debug configs name the shipped assets relative to the repository root."""
    monkeypatch.chdir(REPO)
    return REPO


@pytest.fixture
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep HuggingFace datasets' cache out of the home directory."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    return tmp_path


def test_the_expected_configs_ship() -> None:
    assert all_configs() == sorted(FULL_SIZE + DEBUG)


@pytest.mark.parametrize("name", all_configs())
def test_config_parses_with_torchtitans_config_manager(name: str) -> None:
    from titan_rocm.settings import RocmSettings

    job_config = parse(name)
    assert job_config.job.custom_config_module == "titan_rocm.config"
    assert job_config.experimental.custom_import == "titan_rocm"
    assert job_config.rocm == RocmSettings(**ROCM_OVERRIDES.get(name, {}))
    assert "rocm" in job_config.model.converters
    assert job_config.compile.enable is True
    assert job_config.compile.components == ["model", "loss"]
    assert job_config.metrics.disable_color_printing is True
    assert job_config.training.mixed_precision_param == "bfloat16"


@pytest.mark.parametrize("name", all_configs())
def test_rocm_section_lists_every_setting_at_its_default(name: str) -> None:
    from titan_rocm.settings import RocmSettings

    expected = {**asdict(RocmSettings()), **ROCM_OVERRIDES.get(name, {})}
    assert raw(name)["rocm"] == expected, (
        "the [rocm] section must list every RocmSettings field with its default; "
        "update configs/*.toml when titan_rocm/adapters/tt022/config.py changes"
    )


@pytest.mark.parametrize("name", all_configs())
def test_every_converter_is_registered(name: str) -> None:
    # TorchTitan's float8 converters register when this package is imported (train.py
    # imports it too); registering does not need torchao, building them does.
    import torchtitan.components.quantization  # noqa: F401
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    converters = raw(name)["model"]["converters"]
    missing = [c for c in converters if c not in _registry_model_converter_cls]
    assert not missing, f"{name}: converters not registered: {missing}"
    assert len(set(converters)) == len(converters)


@pytest.mark.parametrize("name", FP8)
def test_fp8_configs_list_torchtitans_float8_converters(name: str) -> None:
    from torchtitan.components.quantization import QuantizationConverter

    job_config = parse(name)
    assert job_config.model.converters == FP8_CONVERTERS
    assert job_config.quantize.grouped_mm.float8.fqns == ["experts"]
    assert "router.gate" in job_config.quantize.linear.float8.filter_fqns
    # The check every quantization converter runs first (one quantization type per job).
    QuantizationConverter._validate(job_config)


# What each TorchTitan v0.2.2 train_configs/<file> (tag v0.2.2, commit 73a0e697) sets, as
# TorchTitan 0.2.2's ConfigManager reads it: every setting whose value differs from
# JobConfig's default (facts read from those files; the files themselves are not copied).
REFERENCE_SETTINGS: dict[str, dict[str, Any]] = {
    "deepseek_v3__debug_model.toml": {
        "job.description": "DeepSeek-V3 debug training",
        "profiling.save_traces_folder": "profile_trace",
        "metrics.log_freq": 1,
        "model.name": "deepseek_v3",
        "lr_scheduler.warmup_steps": 2,
        "lr_scheduler.decay_ratio": 0.8,
        "training.steps": 10,
        "checkpoint.interval": 10,
        "checkpoint.last_save_model_only": False,
        "activation_checkpoint.selective_ac_option": "op",
        "quantize.linear.float8.filter_fqns": ["output", "router.gate"],
        "quantize.grouped_mm.float8.fqns": ["experts"],
    },
    "deepseek_v3__deepseek_v3_16b.toml": {
        "job.description": "DeepSeek-V3 16B model training",
        "profiling.save_traces_folder": "profile_trace",
        "model.name": "deepseek_v3",
        "model.flavor": "16B",
        "model.hf_assets_path": "./assets/hf/deepseek-moe-16b-base",
        "optimizer.lr": 0.00022,
        "lr_scheduler.decay_ratio": 0.8,
        "lr_scheduler.decay_type": "cosine",
        "lr_scheduler.min_lr_factor": 0.1,
        "training.dataset": "c4",
        "training.local_batch_size": 4,
        "training.seq_len": 4096,
        "training.steps": 1000,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "parallelism.expert_parallel_degree": 8,
        "checkpoint.interval": 10,
        "activation_checkpoint.selective_ac_option": "op",
        "compile.enable": True,
        "compile.components": ["loss"],
        "quantize.linear.float8.filter_fqns": ["output", "router.gate"],
        "quantize.grouped_mm.float8.fqns": ["experts"],
    },
    "llama3__debug_model.toml": {
        "job.description": "Llama 3 debug training",
        "profiling.save_traces_folder": "profile_trace",
        "metrics.log_freq": 1,
        "lr_scheduler.warmup_steps": 2,
        "lr_scheduler.decay_ratio": 0.8,
        "training.steps": 10,
        "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
        "checkpoint.interval": 10,
        "checkpoint.last_save_model_only": False,
        "quantize.linear.float8.filter_fqns": ["output"],
        "validation.freq": 5,
        "validation.steps": 10,
    },
    "llama3__llama3_8b.toml": {
        "job.description": "Llama 3 8B training",
        "profiling.enable_profiling": True,
        "profiling.save_traces_folder": "profile_trace",
        "profiling.profile_freq": 100,
        "metrics.enable_tensorboard": True,
        "model.flavor": "8B",
        "model.hf_assets_path": "./assets/hf/Llama-3.1-8B",
        "optimizer.lr": 0.0003,
        "training.dataset": "c4",
        "training.local_batch_size": 1,
        "training.seq_len": 8192,
        "training.steps": 1000,
        "activation_checkpoint.selective_ac_option": "op",
        "quantize.linear.float8.filter_fqns": ["output"],
        "validation.freq": 500,
        "validation.steps": 1200,
    },
    "qwen3__qwen3_32b.toml": {
        "job.description": "Qwen3 32B training",
        "profiling.save_traces_folder": "profile_trace",
        "profiling.profile_freq": 100,
        "model.name": "qwen3",
        "model.flavor": "32B",
        "model.hf_assets_path": "./assets/hf/Qwen3-32B",
        "lr_scheduler.warmup_steps": 600,
        "training.dataset": "c4",
        "training.local_batch_size": 2,
        "training.seq_len": 4096,
        "training.steps": 3000,
        "checkpoint.last_save_model_only": False,
        "checkpoint.export_dtype": "float16",
        "activation_checkpoint.mode": "full",
        "activation_checkpoint.selective_ac_option": "op",
        "quantize.linear.float8.filter_fqns": ["output"],
    },
    "qwen3__qwen3_moe_debug.toml": {
        "job.description": "Qwen 3 MoE debug model training",
        "profiling.save_traces_folder": "profile_trace",
        "profiling.profile_freq": 100,
        "metrics.log_freq": 1,
        "model.name": "qwen3",
        "model.flavor": "debugmodel_moe",
        "optimizer.lr": 0.0003,
        "lr_scheduler.warmup_steps": 2,
        "training.local_batch_size": 4,
        "training.seq_len": 4096,
        "training.steps": 10,
        "checkpoint.interval": 10,
        "checkpoint.last_save_model_only": False,
        "checkpoint.export_dtype": "float16",
        "activation_checkpoint.selective_ac_option": "op",
        "quantize.linear.float8.filter_fqns": ["output"],
    },
}


def effective(job_config: Any) -> dict[str, Any]:
    """Every setting of a parsed job config, flattened (``section.key``)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(job_config):
        value = getattr(job_config, f.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{f.name}.{k}": v for k, v in effective(value).items()})
        else:
            out[f.name] = value
    return out


@pytest.mark.parametrize("name", all_configs())
def test_config_keeps_its_torchtitan_reference_settings(name: str) -> None:
    from torchtitan.config import JobConfig

    header = (CONFIGS_DIR / name).read_text().split("\n[", 1)[0]
    match = re.search(r"Derived from TorchTitan v0\.2\.2 train_configs/(\S+\.toml)", header)
    assert match, f"{name}: the header must say which TorchTitan file it derives from"
    reference = REFERENCE_SETTINGS[match.group(1)]
    defaults = effective(JobConfig())
    ours = {k: v for k, v in effective(parse(name)).items()
            if k in defaults and v != defaults[k] and k != "job.config_file"}

    allowed = CHANGED_EVERYWHERE | CHANGED_IN.get(name, set())
    if name in DEBUG:
        allowed |= CHANGED_IN_DEBUG
    changed = {k for k, v in reference.items() if ours.get(k, defaults[k]) != v} - allowed
    added = set(ours) - set(reference) - ADDED_KEYS - allowed
    assert not changed, f"{name}: changed from {match.group(1)} without a listed reason: " + (
        ", ".join(f"{k}: {reference[k]!r} -> {ours.get(k, defaults[k])!r}"
                  for k in sorted(changed))
    )
    assert not added, f"{name}: settings TorchTitan's file does not have: " + ", ".join(
        f"{k} = {ours[k]!r}" for k in sorted(added))


@pytest.mark.parametrize("name", DEBUG)
def test_debug_configs_use_the_shipped_assets(name: str, in_repo_root: Path) -> None:
    job_config = parse(name)
    assert job_config.training.dataset == "c4_test"
    assert Path(job_config.model.hf_assets_path).resolve() == ASSETS_DIR / "tokenizer"
    assert Path(job_config.training.dataset_path).resolve() == ASSETS_DIR / "dataset"
    assert job_config.training.steps <= 100
    assert job_config.parallelism.expert_parallel_degree == 1  # one GPU


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_configs_keep_torchtitans_data(name: str) -> None:
    job_config = parse(name)
    assert job_config.training.dataset == "c4"
    assert job_config.model.hf_assets_path.startswith("./assets/hf/")


@pytest.mark.parametrize("name", all_configs())
def test_model_builds_on_meta_from_the_config(name: str) -> None:
    import torch
    from torchtitan.protocols.train_spec import get_train_spec

    job_config = parse(name)
    spec = get_train_spec(job_config.model.name)
    # Copy: update_from_config mutates, and the flavor table is shared process-wide.
    model_args = copy.deepcopy(spec.model_args[job_config.model.flavor])
    model_args.update_from_config(job_config)
    with torch.device("meta"):
        model = spec.model_cls(model_args)
    assert sum(p.numel() for p in model.parameters()) > 0
    if name in DEBUG:
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        from titan_rocm.assets import TOKENIZER_DIR

        # Every token id of the shipped tokenizer has an embedding row.
        assert HuggingFaceTokenizer(str(TOKENIZER_DIR)).get_vocab_size() <= model_args.vocab_size


ROUND_TRIP = [
    "The quiet river carried three old bottles past the harbor.",
    "Zürich, café, naïve: 12.5% of 1,024 tokens\nsecond line\ttab  two spaces",
    "Unseen words like xylophone and Quasimodo, emoji 🙂 and 日本語 still round-trip.",
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_shipped_tokenizer_round_trips_with_torchtitans_loader(
    text: str, in_repo_root: Path
) -> None:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer, build_hf_tokenizer

    tokenizer = build_hf_tokenizer(parse("llama3_debug.toml"))
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert (tokenizer.bos_id, tokenizer.eos_id) == (0, 1)
    assert tokenizer.get_vocab_size() == 2000

    ids = tokenizer.encode(text, add_bos=True, add_eos=True)  # as the dataset encodes
    assert ids[0] == tokenizer.bos_id and ids[-1] == tokenizer.eos_id
    assert all(0 <= i < tokenizer.get_vocab_size() for i in ids)
    assert tokenizer.decode(ids[1:-1]) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|begin_of_text|>" + text + "<|end_of_text|>"
    )


def test_shipped_tokenizer_compresses_the_shipped_text(in_repo_root: Path) -> None:
    from torchtitan.components.tokenizer import build_hf_tokenizer

    tokenizer = build_hf_tokenizer(parse("llama3_debug.toml"))
    text = (ASSETS_DIR / "dataset" / "train.jsonl").read_text().splitlines()[0]
    ids = tokenizer.encode(text)
    # A trained BPE, not bytes: well under one token per character on its own corpus.
    assert len(ids) < len(text) / 3


# The debug configs share the assets; one config per batch shape (8 x 2048, 4 x 4096).
@pytest.mark.parametrize("name", ["llama3_debug.toml", "qwen3_moe_debug.toml"])
def test_dataset_loads_with_torchtitans_dataloader(
    name: str, in_repo_root: Path, datasets_cache: Path
) -> None:
    import torch
    from torchtitan.components.tokenizer import build_hf_tokenizer
    from torchtitan.hf_datasets.text_datasets import build_text_dataloader

    job_config = parse(name)
    tokenizer = build_hf_tokenizer(job_config)
    loader = build_text_dataloader(
        dp_world_size=1, dp_rank=0, tokenizer=tokenizer, job_config=job_config
    )
    batch, labels = next(iter(loader))
    inputs = batch["input"]
    shape = (job_config.training.local_batch_size, job_config.training.seq_len)
    assert inputs.shape == shape and labels.shape == shape
    assert inputs.dtype == torch.long
    assert int(inputs.min()) >= 0 and int(inputs.max()) < tokenizer.get_vocab_size()
    assert torch.equal(inputs[:, 1:], labels[:, :-1])  # labels are the next tokens
    assert (inputs == tokenizer.bos_id).any() and (labels == tokenizer.eos_id).any()


def _make_assets_module():
    path = REPO / "scripts" / "make_assets.py"
    spec = importlib.util.spec_from_file_location("make_assets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_assets_are_what_make_assets_produces(tmp_path: Path) -> None:
    written = _make_assets_module().generate(tmp_path)
    shipped = sorted(
        p.relative_to(ASSETS_DIR)
        for p in ASSETS_DIR.rglob("*")
        if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts
    )
    assert shipped == sorted(p.relative_to(tmp_path) for p in written)
    for rel in shipped:
        assert (ASSETS_DIR / rel).read_bytes() == (tmp_path / rel).read_bytes(), (
            f"titan_rocm/assets/{rel} differs from scripts/make_assets.py's output; "
            "rerun: python scripts/make_assets.py"
        )


def test_assets_are_small() -> None:
    total = sum(p.stat().st_size for p in ASSETS_DIR.rglob("*") if p.is_file())
    assert total < 2 * 1024 * 1024


def test_docs_describe_every_config() -> None:
    text = DOC.read_text()
    missing = [name for name in all_configs() if name not in text]
    assert not missing, f"docs/configs.md does not mention {missing}"
