"""Getting collated batches onto a device: :class:`_CudaStage` (a ring of pinned staging
buffers and ``non_blocking`` copies on a side stream) for CUDA, :func:`_to_device` for pinned
CPU tensors and other devices."""

from __future__ import annotations

from typing import Any

import torch

from rowstore.torch._collate import _Var


class _Slot:
    """One pinned staging slot of the ring: a growable pinned byte buffer per batch key, and the
    event recorded after the copies out of it were enqueued."""

    __slots__ = ("bufs", "event")

    def __init__(self):
        self.bufs: dict[str, torch.Tensor] = {}
        self.event = None


class _CudaStage:
    """Copies host batches to a CUDA device on a side stream.

    With ``pin``, tensors are first copied into a ring of pinned buffers (reused across steps;
    a slot is refilled only after the event recorded behind its previous copies completed), so
    the host-to-device copies are truly asynchronous. Device tensors are allocated on the side
    stream; the consumer makes its stream wait for the batch's event and calls
    ``record_stream`` so the caching allocator does not reuse their memory too early.
    """

    def __init__(self, device: torch.device, *, pin: bool, slots: int):
        self.device = device
        self.stream = self._new_stream()
        self.slots = [_Slot() for _ in range(max(2, slots))] if pin else []
        self._next = 0

    # The CUDA calls, one method each (tests drive the pipeline with a CPU stand-in).
    def _new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def _new_event(self) -> Any:
        return torch.cuda.Event()

    def _on_side_stream(self) -> Any:
        return torch.cuda.stream(self.stream)

    def _pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def context(self) -> Any:
        """Entered by the producer thread: makes ``device`` its current device."""
        return torch.cuda.device(self.device)

    def receive(self, event: Any, fresh: list[torch.Tensor]) -> None:
        """Consumer side: the current stream waits for the batch's copies (no host sync), and
        the caching allocator learns that the current stream uses the new tensors."""
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(event)
        for t in fresh:
            t.record_stream(cur)

    def _h2d(self, slot: _Slot | None, key: str, t: torch.Tensor, fresh: list) -> torch.Tensor:
        if slot is not None:
            nbytes = t.numel() * t.element_size()
            buf = slot.bufs.get(key)
            if buf is None or buf.numel() < nbytes:
                buf = self._pinned(max(64, nbytes + nbytes // 4))
                slot.bufs[key] = buf
            staged = buf[:nbytes].view(t.dtype).view(t.shape)
            staged.copy_(t)
            t = staged
        d = self._to_device(t)
        fresh.append(d)
        return d

    def put(self, host: dict) -> tuple[dict, Any, list]:
        """Enqueue the copies of one host batch; returns (device batch, event, new tensors)."""
        slot = None
        if self.slots:
            slot = self.slots[self._next]
            self._next = (self._next + 1) % len(self.slots)
            if slot.event is not None:
                slot.event.synchronize()  # the copies out of this slot (a ring ago) are done
        fresh: list[torch.Tensor] = []
        out: dict[str, Any] = {}
        with self._on_side_stream():
            for k, v in host.items():
                if isinstance(v, torch.Tensor):
                    out[k] = self._h2d(slot, k, v, fresh)
                elif isinstance(v, _Var):
                    values = self._h2d(slot, k, v.values, fresh)
                    offs = (
                        self._h2d(slot, k + "#offsets", v.jag_offsets, fresh)
                        if v.jag_offsets is not None
                        else None
                    )
                    out[k] = v.moved(values, offs)
                else:
                    out[k] = v
            event = self._new_event()
            event.record(self.stream)
        if slot is not None:
            slot.event = event
        return out, event, fresh


def _to_device(out: dict, device: torch.device | None, pin: bool) -> dict:
    """Host path: pin (when asked, for a later copy by the user) or move to a non-CUDA device."""

    def move(t):
        if isinstance(t, torch.Tensor):
            if device is None or device.type == "cpu":
                return t.pin_memory() if pin and not t.is_nested else t
            return t.to(device, non_blocking=pin)
        if isinstance(t, list) and t and isinstance(t[0], torch.Tensor):
            return [move(x) for x in t]
        return t

    return {k: move(v) for k, v in out.items()}
