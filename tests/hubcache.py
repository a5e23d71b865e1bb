"""A Hugging Face Hub cache written the way ``huggingface_hub`` writes it, for offline tests of the Hub paths."""

import hashlib
import os
from pathlib import Path

COMMIT_1 = "1" * 40
COMMIT_2 = "2" * 40
# the suffixes the Hub's default .gitattributes stores in LFS (model weights, archives, arrays); other files are git
# blobs.  Files over 10 MB go to LFS whatever their name.
LFS_SUFFIXES = {".bin", ".pt", ".pth", ".ckpt", ".safetensors", ".pkl", ".pickle", ".h5", ".msgpack", ".onnx",
                ".npy", ".npz", ".tar", ".zip", ".gz", ".model", ".arrow", ".parquet"}  # fmt: skip
LFS_THRESHOLD = 10 * 1024 * 1024


def etag(rel: str, data: bytes) -> str:
    """The name ``hf_hub_download`` gives a file's blob: the Hub's etag of the file, its SHA-256 for an LFS file
    and git's blob id (SHA-1 of ``b"blob <size>\\0" + data``) for any other."""
    if Path(rel).suffix in LFS_SUFFIXES or len(data) > LFS_THRESHOLD:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def put_in_hub_cache(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT_1, ref: str = "main"):
    """Store ``files`` (path in repo → local file) as ``hf_hub_download`` leaves them: the bytes in
    ``blobs/<etag>`` (:func:`etag`), ``snapshots/<commit>/<path>`` a relative symlink to the blob, and
    ``refs/<ref>`` holding the commit hash."""
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    for rel, src in files.items():
        data = Path(src).read_bytes()
        blob = storage / "blobs" / etag(rel, data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = storage / "snapshots" / commit / rel
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return storage


def blob_of(storage: Path, rel: str, commit: str = COMMIT_1) -> Path:
    """The blob a snapshot file links to."""
    return Path(os.path.realpath(storage / "snapshots" / commit / rel))


def flip_bytes(path: Path, offset: int, count: int = 50) -> None:
    """Flip ``count`` bytes of a file in place from ``offset`` (a damaged disk or an interrupted copy)."""
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
