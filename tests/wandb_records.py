"""Read an offline W&B run file (run-*.wandb) without a server: the file is a LevelDB-style
log (a 7-byte header ':W&B' + magic + version, then 32 KiB blocks of records, each with a
7-byte header crc32/length/type) of wandb_internal_pb2.Record protobufs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768


def records(path: str | Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, out, pending = 7, [], b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # block trailer too small for a header
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk, pos = data[pos:pos + length], pos + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def history(path: str | Path) -> dict[str, list]:
    """metric key -> logged values, in order."""
    values: dict[str, list] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                values.setdefault(key, []).append(json.loads(item.value_json))
    return values


def config(path: str | Path) -> dict:
    """config key -> value: the run's initial config, then its later updates."""
    values: dict = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        items = r.run.config.update if kind == "run" else r.config.update if kind == "config" \
            else []
        for item in items:
            values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values


def run_info(path: str | Path) -> dict:
    """The run record's name, group, job type and tags."""
    for r in records(path):
        if r.WhichOneof("record_type") == "run":
            return {"name": r.run.display_name, "group": r.run.run_group,
                    "job_type": r.run.job_type, "tags": list(r.run.tags)}
    raise ValueError(f"{path}: no run record")


def summary(path: str | Path) -> dict:
    """summary key -> its final value (``{"max": v}`` and the like for a metric whose summary
    was defined with ``define_metric``)."""
    values: dict = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values


def table(path: str | Path, key: str) -> dict:
    """The last ``wandb.Table`` logged under ``key``: {"columns": [...], "data": [[...]]},
    read from the run's files folder (``files/media/table/...table.json``)."""
    paths = history(path).get(f"{key}/path")
    if not paths:
        raise KeyError(f"{path}: no table {key!r}")
    return json.loads((Path(path).parent / "files" / paths[-1]).read_text())
