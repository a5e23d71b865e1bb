"""What a GPU run would wait for, found without a GPU: :class:`DeviceWatch` records, while it is active, every
operation that makes the host wait for the device, and every tensor moved between the host and the device.

Run the code with its model and data on the ``meta`` device (shapes and dtypes, no values): a tensor made on the
CPU inside a forward, a loss or a step then fails with a mixed-device error as it would on a GPU, and the watch
records what a GPU run would synchronise on:

* reading a device tensor's value — ``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``.tolist()``, ``if t:``
  (``aten._local_scalar_dense``, ``aten.is_nonzero``, ``aten.equal``) — and ops whose output size depends on the
  values (``nonzero``, indexing with a boolean mask, ``unique``, ``masked_select``, ``repeat_interleave``);
* a copy from the device to the host (``.cpu()``, ``.numpy()``, ``.tolist()``);
* a copy from the host to the device other than the batch's own (``torch.tensor(x, device=...)`` is a blocking
  copy on a GPU; tensors made by a factory on the device — ``torch.full``, ``torch.zeros`` — are not copies).

``torch.tensor`` / ``torch.as_tensor`` with Python data never reach the dispatcher, so the watch also wraps those
two functions while it is active.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
# ops that need the values on the host: reading one, or an output whose size depends on them
READS = {
    aten._local_scalar_dense,
    aten.is_nonzero,
    aten.equal,
    aten.nonzero,
    aten.masked_select,
    aten.unique_dim,
    aten._unique2,
    aten.unique_consecutive,
    aten.repeat_interleave,  # its .Tensor overload (repeats given as a tensor); see _reads
    aten.allclose,
}
COPIES = {aten._to_copy, aten.copy_, aten._copy_from, aten._copy_from_and_resize}
INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}  # with a mask: nonzero inside


@dataclass
class Event:
    kind: str  # "reads the device" | "device→host copy" | "host→device copy"
    op: str
    where: str  # the innermost frames of the package (or of the test) that led to it

    def __str__(self) -> str:
        return f"{self.kind}: {self.op}\n{self.where}"


def _where() -> str:
    ours = ("crate_transformer", "/tests/", "kornia")
    frames = [f for f in traceback.extract_stack() if any(k in f.filename for k in ours)]
    frames = [f for f in frames if "devicecheck" not in f.filename]
    return "".join(traceback.format_list(frames[-6:]))


class DeviceWatch(TorchDispatchMode):
    """Records (in :attr:`events`) the host waits and transfers of a run on ``device`` (see the module docstring).

    ``allowed``: host tensors whose copy to the device is the point (the batch from the data loader).  A value
    read from a ``meta`` tensor cannot go on (there is none): the watch records it, then raises.
    """

    def __init__(self, device: str = "meta", allowed: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.device = torch.device(device).type
        self.allowed = {t.data_ptr() for t in allowed if t.device.type == "cpu"}
        self.events: list[Event] = []

    def allow(self, tensors: Iterable[torch.Tensor]) -> None:
        self.allowed |= {t.data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cpu"}

    def _record(self, kind: str, op: object) -> None:
        self.events.append(Event(kind, str(op), _where()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = any(t.device.type == self.device for t in tensors)
        packet = func.overloadpacket
        masked = packet in INDEXING and any(t is not None and t.dtype == torch.bool for t in args[1])
        unsized = func is aten.repeat_interleave.Tensor and "output_size" not in kwargs
        if on_device and ((packet in READS and (packet is not aten.repeat_interleave or unsized)) or masked):
            self._record("reads the device", func)
            if self.device == "meta":
                raise HostSync(str(self.events[-1]))
        elif packet in COPIES and tensors:
            self._copy(func, tensors, kwargs)
        return func(*args, **kwargs)

    def _copy(self, func: object, tensors: list[torch.Tensor], kwargs: dict) -> None:
        if func.overloadpacket is aten._to_copy:
            src, dst = tensors[0].device.type, torch.device(kwargs.get("device") or tensors[0].device).type
            source = tensors[0]
        else:  # copy_(dst, src)
            dst, src = tensors[0].device.type, tensors[1].device.type if len(tensors) > 1 else tensors[0].device.type
            source = tensors[1] if len(tensors) > 1 else tensors[0]
        if src == self.device and dst == "cpu":
            self._record("device→host copy", func)
            if self.device == "meta":
                raise HostSync(str(self.events[-1]))
        elif src == "cpu" and dst == self.device and source.data_ptr() not in self.allowed:
            self._record("host→device copy", func)

    def __enter__(self) -> DeviceWatch:
        self._factories = (torch.tensor, torch.as_tensor)
        torch.tensor, torch.as_tensor = self._factory(torch.tensor), self._factory(torch.as_tensor)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        torch.tensor, torch.as_tensor = self._factories
        return super().__exit__(*exc)

    def _factory(self, make):  # noqa: ANN001, ANN202
        def made_on_the_host_and_copied(data, *args, **kwargs):  # noqa: ANN001, ANN202
            device = kwargs.get("device", args[1] if make is torch.as_tensor and len(args) > 1 else None)
            if device is not None and torch.device(device).type == self.device and not isinstance(data, torch.Tensor):
                self._record("host→device copy", f"{make.__name__}(<python data>, device={device})")
            return make(data, *args, **kwargs)

        return made_on_the_host_and_copied


class HostSync(AssertionError):
    """A value read from the device (on ``meta``, where there is none to read)."""


def batch_tensors(batch: object) -> list[torch.Tensor]:
    """The tensors of a batch (the data loader's output), whose copies to the device a step makes on purpose."""
    return [t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)]
