"""Blocks with their optimizer state as they travel in a migration (PSLD §5.2):
``PsExported``/``PsImport`` records plus one frame for the parameter and one per
optimizer-state tensor, in order. No copies on the way out; copies on the way in
(the frames' memory belongs to ZeroMQ's message)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import zmq

from dtlaunch.errors import WireError
from dtlaunch.ps.frames import as_buffer, block_spec, tensor_from_frame
from dtlaunch.ps.optim import BlockState
from dtlaunch.ps.store import ParamStore
from dtlaunch.wire.messages import PsBlockState

__all__ = ["blocks_from_frames", "export_frames"]


def export_frames(store: ParamStore, blocks: Sequence[int]) -> tuple[list[PsBlockState], list[Any]]:
    """The records and frame payloads of ``blocks`` (views of the store's tensors)."""
    records: list[PsBlockState] = []
    payloads: list[Any] = []
    for b in blocks:
        param, state = store.params[b], store.states[b]
        names = sorted(state.tensors)
        records.append(PsBlockState(block=block_spec(b, param), step=state.step, tensors=names))
        payloads.append(as_buffer(param))
        payloads += [as_buffer(state.tensors[n]) for n in names]
    return records, payloads


def blocks_from_frames(
    records: Sequence[PsBlockState], frames: Sequence[zmq.Frame]
) -> dict[int, tuple[torch.Tensor, BlockState]]:
    """Each block's parameter and optimizer state, copied out of the frames.

    Raises:
        WireError: the frames do not match the records.
    """
    expected = sum(1 + len(b.tensors) for b in records)
    if len(frames) != expected:
        raise WireError(f"{len(frames)} frames, the blocks need {expected}")
    it = iter(frames)
    blocks: dict[int, tuple[torch.Tensor, BlockState]] = {}
    for record in records:
        spec = record.block
        param = tensor_from_frame(next(it), spec).clone()
        state = {n: tensor_from_frame(next(it), spec).clone() for n in record.tensors}
        blocks[spec.block_id] = (param, BlockState(step=record.step, tensors=state))
    return blocks
