"""Read the records of an offline W&B run (``run-<id>.wandb``), to check what the package logged.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic ``0xBEE1``, version), then LevelDB-log
blocks of 32 KiB, each record split into chunks with a 7-byte header (CRC-32, length, type: 1 full, 2 first,
3 middle, 4 last); each record is a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768


def _chunks(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, out, buf = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # the padded tail of a block
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            out.append(buf)
            buf = b""
    return out


def read_run(folder: Path) -> tuple[str, dict, list[dict]]:
    """(run id, config, history rows) of the one offline run under ``folder`` (a run's ``wandb`` folder)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = folder.glob("offline-run-*/run-*.wandb")
    run_id, config, history = "", {}, []
    for chunk in _chunks(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(chunk)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return run_id, config, history
