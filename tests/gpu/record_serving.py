"""Record a serving workload through the product, with its ground truth, for the detection bench.

    python3 tests/gpu/record_serving.py --scenario never_idle --duration-s 1200 \\
        --out $OUT/gpu_never_idle.jsonl
    python3 tests/gpu/record_serving.py --scenario healthy --duration-s 150 \\
        --out $OUT/gpu_serving_healthy.jsonl
    python3 tests/gpu/record_serving.py --scenario request_leak --duration-s 150 \\
        --out $OUT/gpu_serving_request_leak.jsonl
    python3 tests/gpu/record_serving.py --scenario healthy --device cpu --duration-s 20 \\
        --out /tmp/dry.jsonl     # a dry run of the script itself (tiny model, no allocator data)

This is what a user does: ``vramscope.install()`` with a sink (here one that streams trace v1
lines to ``--out``, flushed every second, so a killed run still leaves a readable trace up to its
last second), ``vramscope.attach_transformers(model)`` on a random-weight Llama built from a
config (no hub, no network), then ``generate()`` requests for ``--duration-s`` seconds:

- ``healthy``: one request at a time, arrivals from a Poisson process whose rate follows a
  sine of period ``--cycle-s`` (a compressed day: busy, then quiet, then busy), prompts and
  outputs of varying length. Nothing leaks.
- ``request_leak``: the same, but each request's last ``--keep-steps`` (4) steps' logits stay on
  the GPU (a list the "server" never clears): 4 x vocab x 4 B = 512,000 B per request with the
  default 32,000-token vocabulary, ~0.5 MB/s at the mean arrival rate, from the first request on.
- ``never_idle``: ``--threads`` clients each sending the next request as soon as the last one
  returns (plus a short think time), so requests overlap and the server is never idle; from
  ``--leak-start-s`` on, every ``--leak-every``-th request keeps a ``--leak-bytes`` tensor (2 MiB
  by default): a slow, known leak under a floor that never sees an empty server.

The trace is kept small for long runs: the allocator is sampled every ``--sample-s`` (0.5 s),
snapshots every 60 s. Beside the trace it writes ``<out>.truth.json`` (rewritten every
``--truth-every-s`` and at the end): the scenario and arguments, the versions, the leak's start,
its bytes per request and per second (from the tensors actually kept), every leaked allocation
``[ts, bytes]``, per-request timings ``[start_ts, end_ts, prompt_tokens, new_tokens, thread]``,
errors, and the allocator's figures at the end. Times are the records' clock (``time.time()``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# cb_models beside this file: the script's folder is sys.path[0]. Not the repo root: its
# vramscope/ (the facade alone) would shadow the installed package on the GPU machine.
sys.path.append(str(Path(__file__).resolve().parent))

import cb_models  # noqa: E402
import torch  # noqa: E402
from vramscope.agent.config import parse_config  # noqa: E402
from vramscope.agent.trace import event_to_json, sample_to_json  # noqa: E402

import vramscope  # noqa: E402

MIB = 2**20
SCENARIOS = ("healthy", "request_leak", "never_idle")


class TeeSink:
    """Every record to the trace file and to a running agent (``--agent-socket``), through the
    hooks' own client, as a user's server sends them: the agent's store and its live verdicts
    can then be compared with ``analyze`` of the trace."""

    def __init__(self, trace: StreamingTraceSink, config: Any) -> None:
        from vramscope.hooks.client import make_default_sink

        self.trace = trace
        self.agent = make_default_sink(config, process=Path(trace.path).stem,
                                       model="llama-random")

    def put(self, record: Any) -> None:
        self.trace.put(record)
        self.agent.put(record)

    def close(self) -> None:
        self.agent.close()


class StreamingTraceSink:
    """A ``RecordSink`` that writes trace v1 lines as records arrive.

    ``put`` only enqueues (the hooks' threads never wait on the disk); a writer thread writes
    the lines and flushes every ``flush_s``, so the file on disk is at most that far behind.
    Post-mortems (the OOM observer's) are kept in memory for the truth file. Lines are in
    arrival order, which is time order to within the hooks' queueing; the reader does not
    require more.
    """

    def __init__(self, path: str, flush_s: float = 1.0) -> None:
        self.path = path
        self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._flush_s = flush_s
        self._stop = threading.Event()
        self.lines = 0
        self.postmortems: list[Any] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
        self._thread.start()

    def put(self, record: Any) -> None:
        self._queue.put(record)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self._flush_s)
            self._drain()

    def _drain(self) -> None:
        try:
            while True:
                try:
                    record = self._queue.get_nowait()
                except queue.Empty:
                    break
                line = self._line(record)
                if line is not None:
                    self._fh.write(line)
                    self.lines += 1
            self._fh.flush()
        except Exception as exc:  # a full disk: say so once per kind, keep the run going
            message = repr(exc)
            if message not in self.errors:
                self.errors.append(message)
                print(f"trace writer: {message}", file=sys.stderr, flush=True)

    def _line(self, record: Any) -> str | None:
        if isinstance(record, vramscope.Sample):
            obj = sample_to_json(record)
        elif isinstance(record, vramscope.Event):
            obj = event_to_json(record)
        else:
            self.postmortems.append(record)
            return None
        return json.dumps(obj, separators=(",", ":")) + "\n"

    def close(self) -> None:
        """Idempotent: stop the writer, write what is left, close the file."""
        if self._fh.closed:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._drain()
        try:
            os.fsync(self._fh.fileno())
        except OSError:
            pass
        self._fh.close()


class Recorder:
    """The workload and its ground truth; thread-safe."""

    def __init__(self, args: argparse.Namespace, model: Any, cuda: bool) -> None:
        self.args = args
        self.model = model
        self.cuda = cuda
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.t0 = time.time()
        self.kept: list[Any] = []  # the leak: tensors the "server" never lets go of
        self.leaks: list[list[float]] = []  # [ts, bytes]
        self.requests: list[list[Any]] = []  # [start, end, prompt, new_tokens, thread]
        self.errors: list[str] = []
        self.served = 0

    # -- one request -----------------------------------------------------------------------
    def request(self, thread: int, rng: random.Random) -> None:
        a = self.args
        prompt_len = rng.randint(a.prompt_min, a.prompt_max)
        new_tokens = rng.randint(a.new_min, a.new_max)
        ids = torch.randint(1, a.vocab, (1, prompt_len), device=a.device)
        start = time.time()
        try:
            with torch.inference_mode():
                out = self.model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                    eos_token_id=None, return_dict_in_generate=True,
                    output_logits=a.scenario == "request_leak")
            self._after(out, thread)
        except Exception as exc:  # an OOM or a library error: recorded, the run goes on
            with self.lock:
                self.errors.append(f"{time.time():.3f} thread {thread}: {exc!r}"[:500])
            if len(self.errors) <= 3:
                traceback.print_exc()
            time.sleep(0.5)
            return
        finally:
            del ids
        with self.lock:
            self.requests.append([round(start, 4), round(time.time(), 4), prompt_len,
                                  new_tokens, thread])

    def _after(self, out: Any, thread: int) -> None:
        a = self.args
        keep = None
        with self.lock:
            self.served += 1
            n = self.served
        if a.scenario == "request_leak":
            # the last --keep-steps steps' logits, (steps, vocab) fp32: a known size per request
            keep = torch.cat([x.detach() for x in out.logits[-a.keep_steps:]]).float()
        elif (a.scenario == "never_idle" and time.time() - self.t0 >= a.leak_start_s
              and n % a.leak_every == 0):
            keep = torch.empty(a.leak_bytes, dtype=torch.uint8, device=a.device)
        if keep is not None:
            nbytes = keep.untyped_storage().nbytes()
            with self.lock:
                self.kept.append(keep)
                self.leaks.append([round(time.time(), 4), nbytes])

    # -- arrivals ---------------------------------------------------------------------------
    def rate(self, t: float) -> float:
        """Requests per second at ``t`` s into the run: a compressed day."""
        a = self.args
        phase = math.sin(2 * math.pi * t / a.cycle_s)
        return a.rate_min + (a.rate_max - a.rate_min) * (0.5 + 0.5 * phase)

    def run_arrivals(self) -> None:
        """One server thread, requests from a Poisson process of time-varying rate (thinning);
        a request arriving while one runs waits for it (a queue of one server)."""
        rng = random.Random(self.args.seed + 1)
        next_at = time.time()
        while not self.stop.is_set():
            peak = max(self.args.rate_max, 1e-6)
            next_at += rng.expovariate(peak)
            if rng.random() > self.rate(next_at - self.t0) / peak:
                continue
            wait = next_at - time.time()
            if wait > 0 and self.stop.wait(wait):
                return
            self.request(0, rng)

    def run_client(self, thread: int) -> None:
        """A never-idle client: the next request as soon as the last one returns."""
        rng = random.Random(self.args.seed + 100 + thread)
        time.sleep(thread * 0.05)  # staggered starts
        while not self.stop.is_set():
            self.request(thread, rng)
            if self.stop.wait(rng.uniform(0, self.args.think_s)):
                return

    # -- ground truth -------------------------------------------------------------------------
    def truth(self, sink: StreamingTraceSink, report: Any, final: bool) -> dict[str, Any]:
        a = self.args
        with self.lock:
            leaks = list(self.leaks)
            requests = list(self.requests)
            errors = list(self.errors)
        leaked = sum(b for _, b in leaks)
        start = leaks[0][0] if leaks else None
        end = time.time()
        if a.scenario == "never_idle":
            start = self.t0 + a.leak_start_s if end - self.t0 > a.leak_start_s else None
        elif a.scenario == "request_leak" and requests:
            start = requests[0][0]
        span = end - start if start is not None else 0.0
        truth: dict[str, Any] = {
            "scenario": a.scenario, "final": final, "args": vars(a),
            "versions": cb_models.versions(), "install": report.to_json(),
            "t0": self.t0, "t_end": end, "duration_s": end - self.t0,
            "leak": {
                # never_idle with its leak past the end (a healthy partner) leaks nothing
                "present": a.scenario != "healthy"
                and (a.scenario != "never_idle" or a.leak_start_s < a.duration_s),
                "start_ts": start,
                "bytes_total": leaked,
                "bytes_per_leaking_request": leaks[0][1] if leaks else None,
                "leaking_requests": len(leaks),
                "bytes_per_s": leaked / span if span > 0 else 0.0,
                "how": {"healthy": "none",
                        "request_leak": f"each request's last {a.keep_steps} steps' logits "
                                        "kept on the GPU",
                        "never_idle": f"{a.leak_bytes} B kept every {a.leak_every}th request "
                                      f"from {a.leak_start_s:g} s"}[a.scenario],
            },
            "leaks": leaks,
            "requests_served": len(requests),
            "request_fields": ["start_ts", "end_ts", "prompt_tokens", "new_tokens", "thread"],
            "requests": requests,
            "errors": errors, "trace_lines": sink.lines, "trace_errors": sink.errors,
            "postmortems": len(sink.postmortems),
            "oom_expected": False,
        }
        if self.cuda:
            truth["allocator_end"] = {"allocated_bytes": torch.cuda.memory_allocated(0),
                                      "reserved_bytes": torch.cuda.memory_reserved(0),
                                      "max_allocated_bytes": torch.cuda.max_memory_allocated(0),
                                      "total_bytes": torch.cuda.get_device_properties(0)
                                      .total_memory}
        return truth


def write_json(path: str, obj: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, separators=(",", ":"))
        fh.write("\n")
    os.replace(tmp, path)  # a reader never sees half a file


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", required=True, help="the trace v1 file (JSON Lines) to write")
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--duration-s", type=float, default=150.0)
    p.add_argument("--device", default="cuda", help="cpu: a dry run with a tiny model")
    p.add_argument("--layers", type=int, default=None, help="default 4 (cuda), 2 (cpu)")
    p.add_argument("--hidden", type=int, default=None, help="default 1024 (cuda), 128 (cpu)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt-min", type=int, default=32)
    p.add_argument("--prompt-max", type=int, default=None, help="default 512 (cuda), 64 (cpu)")
    p.add_argument("--new-min", type=int, default=16)
    p.add_argument("--new-max", type=int, default=None, help="default 128 (cuda), 24 (cpu)")
    p.add_argument("--rate-min", type=float, default=0.2, help="requests/s at the quiet time")
    p.add_argument("--rate-max", type=float, default=2.0, help="requests/s at the busy time")
    p.add_argument("--cycle-s", type=float, default=60.0, help="period of the arrival rate")
    p.add_argument("--keep-steps", type=int, default=4,
                   help="request_leak: the last steps' logits kept per request (vocab x 4 B each)")
    p.add_argument("--threads", type=int, default=4, help="never_idle: concurrent clients")
    p.add_argument("--think-s", type=float, default=0.2, help="never_idle: max pause between")
    p.add_argument("--leak-start-s", type=float, default=180.0, help="never_idle: leak from")
    p.add_argument("--leak-every", type=int, default=20, help="never_idle: every n-th request")
    p.add_argument("--leak-bytes", type=int, default=2 * MIB, help="never_idle: bytes kept")
    p.add_argument("--sample-s", type=float, default=0.5, help="allocator sampling interval")
    p.add_argument("--snapshot-s", type=float, default=60.0, help="snapshot interval")
    p.add_argument("--truth-every-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--agent-socket", default=None,
                   help="also send every record to the agent listening on this socket")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    for name, gpu, cpu in (("layers", 4, 2), ("hidden", 1024, 128), ("prompt_max", 512, 64),
                           ("new_max", 128, 24)):
        if getattr(args, name) is None:
            setattr(args, name, gpu if cuda else cpu)
    if not cuda and args.vocab == 32000:
        args.vocab = 1024
    if args.prompt_max < args.prompt_min or args.new_max < args.new_min:
        p.error("--prompt-max/--new-max must be >= --prompt-min/--new-min")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device; use --device cpu for a dry run", file=sys.stderr)
        return 2
    model = cb_models.llama(args.layers, args.hidden, vocab=args.vocab, device=args.device,
                            kv_heads=min(4, max(1, args.hidden // 128)))
    # generate() needs a standard attention: cb_models picks transformers 5.17's "paged|sdpa"
    # for generate_batch, which refuses a forward without a paged cache.
    model.set_attn_implementation("sdpa")
    sink = StreamingTraceSink(args.out)
    raw: dict[str, Any] = {"sampling": {"allocator_interval_s": args.sample_s,
                                        "snapshot_interval_s": args.snapshot_s}}
    if args.agent_socket:
        raw["agent"] = {"socket_path": args.agent_socket}
    config = parse_config(raw, None, {})
    report = vramscope.install(config, sink=TeeSink(sink, config) if args.agent_socket else sink)
    print(report, flush=True)
    handle = vramscope.attach_transformers(model)
    print(f"transformers hooks: {handle.hooks}; missing: {handle.missing}", flush=True)
    rec = Recorder(args, model, cuda)
    truth_path = args.out + ".truth.json"
    # SIGTERM/SIGINT end the run cleanly: the trace and the truth are written either way.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: rec.stop.set())
    if args.scenario == "never_idle":
        workers = [threading.Thread(target=rec.run_client, args=(i,), daemon=True,
                                    name=f"client-{i}") for i in range(args.threads)]
    else:
        workers = [threading.Thread(target=rec.run_arrivals, daemon=True, name="server")]
    try:
        for w in workers:
            w.start()
        deadline = rec.t0 + args.duration_s
        next_truth = rec.t0 + args.truth_every_s
        while not rec.stop.is_set() and time.time() < deadline:
            rec.stop.wait(min(1.0, max(0.0, deadline - time.time())))
            if time.time() >= next_truth:
                write_json(truth_path, rec.truth(sink, report, final=False))
                next_truth += args.truth_every_s
                print(f"{time.time() - rec.t0:7.1f} s: {rec.served} requests, "
                      f"{len(rec.leaks)} leaked, {sink.lines} trace lines, "
                      f"{len(rec.errors)} errors", flush=True)
        rec.stop.set()
        for w in workers:
            w.join(timeout=120)
        time.sleep(2 * args.sample_s)  # the last samples after the last request
    finally:
        rec.stop.set()
        try:
            handle.detach()
        finally:
            vramscope.uninstall()  # closes the sink: the remaining lines written, fsynced
            sink.close()
            truth = rec.truth(sink, report, final=True)
            write_json(truth_path, truth)
    summary = {k: v for k, v in truth.items() if k not in ("requests", "leaks", "install")}
    print(json.dumps(summary, indent=1, default=str), flush=True)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / MIB:.2f} MiB, {sink.lines} lines) "
          f"and {truth_path}", flush=True)
    return 0 if truth["requests_served"] > 0 and not sink.errors else 1


if __name__ == "__main__":
    sys.exit(main())
