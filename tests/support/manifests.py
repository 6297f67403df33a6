"""Edits of export manifests made by tests that need a broken or an older manifest."""

from __future__ import annotations


def set_manifest_field(manifest: dict, key: str, value: object) -> None:
    """Set a manifest field where it lives: encoder settings sit under ``"encoder"`` (format 2)."""
    from magretrieve.core.manifest import ENCODER_FIELDS

    if key in ENCODER_FIELDS and isinstance(manifest.get("encoder"), dict):
        manifest["encoder"][key] = value
    else:
        manifest[key] = value
