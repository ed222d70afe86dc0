"""Where a run's checkpoints are committed so that another driver, on another machine, can
take the run over: a folder (a shared filesystem: NFS, a mounted bucket) or an S3 bucket
(``s3://bucket/prefix``, on AWS or any S3-compatible server: ``AWS_ENDPOINT_URL`` names it, and
the usual AWS variables or files give the credentials).

A step is committed by its manifest (``<step>/manifest.json``: each file's size and SHA-256),
written after every file of the step: a step without one was never committed (its driver died
while writing it) and is not resumed from; a step whose files do not match their manifest is
refused by name. The driver writes; a new driver lists the committed steps and fetches one.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

from artsdk.errors import BackendError, CheckpointError

MANIFEST = "manifest.json"
_STEP = re.compile(r"^\d+$")


class SharedCheckpoints:
    """The committed steps of one model under ``url`` (``<url>/<project>/<model>/<step>/``)."""

    def __init__(self, url: str, project: str, model: str) -> None:
        self.url = url.rstrip("/")
        self.where = f"{self.url}/{project}/{model}"
        if "://" in url and not url.startswith("s3://"):
            raise BackendError(f"checkpoints_url {url!r}: give a folder (a shared filesystem) or s3://bucket/prefix")
        self._files: _Files = _Bucket(self.where) if url.startswith("s3://") else _Folder(Path(self.where).expanduser())

    def steps(self) -> list[int]:
        """The committed steps, oldest first."""
        return sorted(int(s) for s in self._files.list_steps() if self._files.exists(f"{s}/{MANIFEST}"))

    def put(self, step: int, files: dict[str, bytes]) -> None:
        """Commit ``step``: its files, then its manifest."""
        self._files.delete(f"{step}/{MANIFEST}")  # (an earlier, uncommitted attempt at it)
        for name, data in files.items():
            self._files.write(f"{step}/{name}", data)
        manifest = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
        self._files.write(f"{step}/{MANIFEST}", json.dumps({"step": step, "files": manifest}, indent=2).encode())

    def get(self, step: int) -> dict[str, bytes]:
        """The files of committed ``step``, checked against its manifest (CheckpointError naming
        the file and the newest earlier committed step)."""
        name = MANIFEST
        try:
            manifest = json.loads(self._files.read(f"{step}/{name}"))["files"]
            files = {}
            for name in manifest:
                files[name] = self._files.read(f"{step}/{name}")
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise self._unreadable(step, name, f"cannot be read ({e})") from None
        for name, data in files.items():
            if len(data) != manifest[name]["bytes"] or hashlib.sha256(data).hexdigest() != manifest[name]["sha256"]:
                raise self._unreadable(step, name, "does not match its manifest (changed or cut short)")
        return files

    def _unreadable(self, step: int, name: str, why: str) -> CheckpointError:
        earlier = [s for s in self.steps() if s < step]
        readable = earlier[-1] if earlier else None
        hint = (f"resume from step {readable} (art.session(model, resume={readable}))" if readable is not None
                else "no earlier step is committed")
        return CheckpointError(f"{self.where}/{step}/{name} {why}; {hint}", step=step, file=name, readable=readable)

    def remove(self, step: int) -> None:
        """Un-commit ``step`` (the manifest first), then delete its files."""
        self._files.delete(f"{step}/{MANIFEST}")
        self._files.delete_step(str(step))


class _Files(Protocol):
    """Objects by key (``<step>/<file>``): a folder's files, or a bucket's objects."""

    def list_steps(self) -> list[str]: ...
    def exists(self, key: str) -> bool: ...
    def read(self, key: str) -> bytes: ...
    def write(self, key: str, data: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def delete_step(self, step: str) -> None: ...


class _Folder:
    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BackendError(f"checkpoints_url {str(root)!r} cannot be written: {e.strerror or e}") from None

    def list_steps(self) -> list[str]:
        return [p.name for p in self.root.iterdir() if p.is_dir() and _STEP.match(p.name)]

    def exists(self, key: str) -> bool:
        return (self.root / key).is_file()

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # whole or absent

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def delete_step(self, step: str) -> None:
        shutil.rmtree(self.root / step, ignore_errors=True)


class _Bucket:
    def __init__(self, url: str) -> None:
        try:
            import boto3
        except ImportError:
            raise BackendError("checkpoints_url s3://... needs boto3: pip install -e \".[s3]\"") from None
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise BackendError(f"checkpoints_url {url!r} names no bucket; write s3://bucket/prefix")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.s3: Any = boto3.client("s3")
        try:
            self.s3.head_bucket(Bucket=bucket)
        except Exception as e:  # noqa: BLE001 - botocore raises its own for every cause
            raise BackendError(f"checkpoints_url {url!r}: the bucket cannot be reached ({e}); check the name, "
                               f"AWS_ENDPOINT_URL and the credentials") from None

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def list_steps(self) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(""),
                                                                  Delimiter="/")
        found = [p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for page in pages for p in page.get("CommonPrefixes", [])]
        return [s for s in found if _STEP.match(s)]

    def exists(self, key: str) -> bool:
        return bool(self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self._key(key), MaxKeys=1).get("KeyCount"))

    def read(self, key: str) -> bytes:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            raise OSError(f"no object {key}") from None

    def write(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)  # an object is whole or absent

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_step(self, step: str) -> None:
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self._key(f"{step}/")).get("Contents", [])
        for obj in listed:
            self.s3.delete_object(Bucket=self.bucket, Key=obj["Key"])

