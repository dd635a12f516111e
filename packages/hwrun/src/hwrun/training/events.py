"""TensorBoard-compatible scalar logs without TensorBoard installed: `EventLog`, a TrainerCallback that writes each
logged number (training loss, learning rate, gradient norm, eval loss, tokens/s) as a scalar summary into an event
file (`events.out.tfevents.*`), which `tensorboard --logdir OUTPUT` reads.

The format is TensorBoard's: a TFRecord file (per record: length as uint64 little-endian, its masked CRC32C, the
bytes, their masked CRC32C) of `Event` protocol buffers (tensorboard/compat/proto/event.proto: wall_time = 1 (double),
step = 2 (int64), file_version = 3 (string), summary = 5 (Summary: repeated Value value = 1, Value: tag = 1 (string),
simple_value = 2 (float))). Only those fields are written, by hand, so nothing beyond the standard library is needed.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO

from transformers import TrainerCallback

#: The folder (inside the output folder) the event files go to, one subfolder per training session.
EVENTS_DIR = "hwrun-tensorboard"

_CRC_TABLE: list[int] = []


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use."""
    if not _CRC_TABLE:
        for byte in range(256):
            crc = byte
            for _ in range(8):
                crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
            _CRC_TABLE.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int, *, scalars: dict[str, float] | None = None,
                 file_version: str | None = None) -> bytes:
    """One `Event` message: scalars as a Summary of simple values, or the file-version header."""
    body = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        body += _field(3, file_version.encode())
    if scalars:
        values = b"".join(_field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
                          for tag, value in scalars.items())
        body += _field(5, values)
    return body


def frame(record: bytes) -> bytes:
    """A TFRecord frame around `record`."""
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record))


class EventWriter:
    """Appends scalar events to a new `events.out.tfevents.<time>.<host>.hwrun` file in `folder`."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = self.folder / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.hwrun"
        self._file: BinaryIO | None = open(self.path, "xb")  # noqa: SIM115 - closed in close(); never an old file
        self._write(encode_event(now, 0, file_version="brain.Event:2"))

    def _write(self, record: bytes) -> None:
        assert self._file is not None
        self._file.write(frame(record))
        self._file.flush()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write `values` ({tag: number}) at `step`."""
        if values and self._file is not None:
            self._write(encode_event(time.time(), step, scalars=values))

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


#: Trainer's log keys and the TensorBoard tags they are written under (others: train/<key>, eval/<key>).
TAGS = {"loss": "train/loss", "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
        "eval_loss": "eval/loss"}


def tag_of(key: str) -> str:
    """The TensorBoard tag of one of Trainer's log keys."""
    if key in TAGS:
        return TAGS[key]
    return f"eval/{key.removeprefix('eval_')}" if key.startswith("eval_") else f"train/{key}"


def session_folder(root: Path) -> Path:
    """A new folder under `root` for one training session: its UTC start time, with -2, -3, ... when a session
    started in the same second (a resume right after a run), so no session ever writes into another's file."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    folder, n = root / stamp, 1
    while folder.exists():
        n += 1
        folder = root / f"{stamp}-{n}"
    return folder


class EventLog(TrainerCallback):
    """Writes every number Trainer logs, plus tokens/s, as TensorBoard scalars under `folder` (main process only);
    `tokens_per_step`: the tokens one optimizer step trains on (0: no tokens/s)."""

    def __init__(self, folder: str | os.PathLike, tokens_per_step: int = 0) -> None:
        self.folder = Path(folder)
        self.tokens_per_step = tokens_per_step
        self.writer: EventWriter | None = None
        self._last: tuple[float, int] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.writer is None:
            self.writer = EventWriter(session_folder(self.folder))
            self._last = (time.monotonic(), state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.writer is None or not logs:
            return
        values = {tag_of(k): float(v) for k, v in logs.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch"}
        if "loss" in logs and self.tokens_per_step and self._last is not None:
            now, step = time.monotonic(), state.global_step
            seconds, steps = now - self._last[0], step - self._last[1]
            if seconds > 0 and steps > 0:
                values["train/tokens_per_second"] = steps * self.tokens_per_step / seconds
            self._last = (now, step)
        self.writer.scalars(state.global_step, values)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the event file (idempotent): at the end of training, and by `train()` when training raised, where
        Trainer calls no on_train_end (an open file kept a full disk's mount busy after a failed save)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
