"""Every rank's record row, brought to the host without making the host wait for the device.

Enqueued at ``should_log``, before TorchTitan 0.2.2's own ``.item()``, so the copy has landed
by ``MetricsProcessor.log``; :meth:`Snapshot.rows` says when it had to wait (``waited``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from titan_rocm.workarounds.divergence_guard.record import NonFiniteRecord, Row
from titan_rocm.workarounds.divergence_guard.verdict import distributed


def gather_rows_on_device(row: torch.Tensor) -> torch.Tensor:
    """Every rank's row as a (world_size, fields) tensor on ``row``'s device (no host read)."""
    if not distributed():
        return row.reshape(1, -1)
    out = torch.empty((dist.get_world_size(), row.numel()), dtype=row.dtype, device=row.device)
    # A list of views of one buffer: all_gather is implemented by every backend (gloo too).
    dist.all_gather(list(out.unbind(0)), row.contiguous())
    return out


class Snapshot:
    """A host copy, possibly still in flight, of every rank's record at one log step."""

    def __init__(self, step: int, steps_ended: int, host: torch.Tensor,
                 event: torch.cuda.Event | None) -> None:
        self.step = step
        """The step whose ``should_log`` took it (``MetricsProcessor.log`` gets the same)."""
        self.steps_ended = steps_ended
        """``record.steps_ended`` when it was taken: the steps it covers."""
        self.host = host
        self.event = event
        self.waited = False
        """Reading it had to wait for the device (a synchronisation the trainer did not do)."""

    @classmethod
    def take(cls, record: NonFiniteRecord, step: int, device: torch.device) -> Snapshot:
        """Enqueue the gather and the device-to-host copy; returns at once on a GPU."""
        gathered = gather_rows_on_device(record.row_tensor(device))
        if gathered.device.type == "cpu":
            return cls(step, record.steps_ended, gathered.clone(), None)
        if gathered.device.type != "cuda":  # no event API we rely on: copy now (a wait)
            snapshot = cls(step, record.steps_ended, gathered.cpu(), None)
            snapshot.waited = True
            return snapshot
        host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
        host.copy_(gathered, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(step, record.steps_ended, host, event)

    def ready(self) -> bool:
        """The copy has landed (polls the event; never waits)."""
        return self.event is None or self.event.query()

    def rows(self) -> list[Row]:
        """Every rank's row (index = rank); waits only if the copy is still in flight."""
        if not self.ready():
            assert self.event is not None
            self.event.synchronize()
            self.waited = True
        return [Row.from_values(values) for values in self.host.tolist()]
