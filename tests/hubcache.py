"""A Hugging Face Hub cache written the way ``huggingface_hub`` writes it, for offline tests of the Hub paths."""

import hashlib
import os
from pathlib import Path

COMMIT_1 = "1" * 40
COMMIT_2 = "2" * 40


def put_in_hub_cache(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT_1, ref: str = "main"):
    """Store ``files`` (path in repo → local file) as ``hf_hub_download`` leaves them: the bytes in
    ``blobs/<sha256>`` (an LFS file's etag is its SHA-256), ``snapshots/<commit>/<path>`` a relative symlink
    to the blob, and ``refs/<ref>`` holding the commit hash."""
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    for rel, src in files.items():
        data = Path(src).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = storage / "snapshots" / commit / rel
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return storage
