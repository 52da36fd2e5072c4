"""LLM artefact manifests for tests: a checkpoint's and a tuning cache's, with the fields a test
cares about as arguments and the rest filled in."""

from __future__ import annotations

from collections.abc import Sequence

from trtforge.contract.llm import (
    ArtefactFile,
    ArtefactFormat,
    ArtefactKind,
    ArtefactManifest,
    Backend,
    Calibration,
    CheckpointInfo,
    GoldenTokens,
    Recipe,
    SourceRef,
    TuningRecord,
)


def checkpoint_manifest(
    key: str,
    source: SourceRef,
    files: Sequence[ArtefactFile] = (),
    *,
    upload: str = "0" * 16,
    fmt: ArtefactFormat = ArtefactFormat.GGUF,
    backend: Backend = Backend.LLAMA_CPP,
    backend_version: str = "test",
    recipe: Recipe = Recipe.BF16,
    quantized_type: str = "BF16",
    model_file: str = "model.gguf",
    golden: GoldenTokens | None = None,
) -> ArtefactManifest:
    return ArtefactManifest(
        kind=ArtefactKind.CHECKPOINT,
        key=key,
        format=fmt,
        backend=backend,
        backend_version=backend_version,
        upload=upload,
        files=list(files),
        checkpoint=CheckpointInfo(
            source=source,
            recipe=recipe,
            calibration=Calibration(),
            quantized_type=quantized_type,
            model_file=model_file,
            golden=golden,
        ),
    )


def tuning_manifest(
    key: str, record: TuningRecord, files: Sequence[ArtefactFile] = (), *, upload: str = "0" * 16
) -> ArtefactManifest:
    return ArtefactManifest(
        kind=ArtefactKind.TUNING_CACHE,
        key=key,
        format=ArtefactFormat.TUNING_RECORD,
        backend=record.backend,
        backend_version=record.backend_version,
        upload=upload,
        files=list(files),
        tuning=record,
    )
