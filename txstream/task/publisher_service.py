"""A slot's producer that outlives the Python worker: one small process per transactional.id per
executor, to which the slot's publishing task hands its rows (docs/architecture.md §3, invariant 4).

Why: a Python worker keeps its producer across batches (publish.py), but Spark hands a task
whichever idle worker comes first, and a narrow task uses two (reader, publisher), so a slot's
publishing task landed on another worker nearly every batch and paid a new producer and
`init_transactions` each time (a round trip to the transaction coordinator, which writes its log).
Kafka Streams keeps one producer per stream thread for the thread's life; this process is that
thread's stand-in. It runs `publish_ranges` itself, so the protocol is the same code either way:
the re-check after init, one transaction per slot, the classification of errors.

The service is an extension of the task while it works for it, never more:
- it takes one task at a time; another (a speculative copy) is told "busy" and publishes in its
  own worker, whose `init_transactions` fences the service's producer (the owner marker tells the
  service so before its next use);
- when the task it works for goes away (killed, cancelled), it exits at once, as the task's worker
  would have: the next attempt's `init_transactions` settles what it left open;
- it exits when its executor (the JVM it was started under) is gone, and when idle for
  `producer_idle_s` (its slot's tasks run elsewhere now).
A task that cannot reach a service starts one for the next batch and publishes in its own worker.

Narrow slots only: there are as many as task slots. A wide batch's output units (as many as the
input partitions, by default) would need that many processes per executor; their producers stay
in the Python workers (task/units.py).

The address is an abstract Unix socket (no file to clean up; per network namespace, so per host)
named after the executor's process and the transactional.id. Rows travel as Arrow IPC messages.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator

import pyarrow as pa

from txstream.errors import InfrastructureError, TxstreamError
from txstream.task import sidefile

_FRAME = struct.Struct(">cI")   # kind, length
SCHEMA, BATCH, END = b"S", b"B", b"E"
READY, BUSY = b"K", b"B"
HANDSHAKE_TIMEOUT_S = 5.0
RESPAWN_AFTER_S = 10.0   # a worker starts a service for one name at most this often
WATCH_INTERVAL_S = 0.2


# -- addressing ---------------------------------------------------------------------------------

def executor_pid() -> int | None:
    """The JVM this Python process runs under (a worker's parent is the daemon, its parent the
    executor; in local mode the driver's JVM): the first `java` among the ancestors."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)
            comm = fields[0].split(b"(", 1)[1]
            parent = int(fields[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None
        if comm == b"java":
            return pid
        if parent <= 1:
            return None
        pid = parent
    return None


def address(jvm_pid: int, transactional_id: str) -> bytes:
    digest = hashlib.sha1(f"{jvm_pid}/{transactional_id}".encode()).hexdigest()[:32]
    return b"\0txstream-publisher-" + digest.encode()


# -- framing ------------------------------------------------------------------------------------

def _send(sock: socket.socket, kind: bytes, payload: bytes | memoryview = b"") -> None:
    sock.sendall(_FRAME.pack(kind, len(payload)))
    if payload:
        sock.sendall(payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the other side closed the connection")
        got += k
    return buffer


def _recv(sock: socket.socket) -> tuple[bytes, bytearray]:
    kind, length = _FRAME.unpack(_recv_exactly(sock, _FRAME.size))
    return kind, _recv_exactly(sock, length) if length else bytearray()


# -- the task's side ----------------------------------------------------------------------------

_SPAWNED: dict[bytes, tuple[subprocess.Popen, float]] = {}


def publish(tid: str, work: Callable[..., list[Any]], args: tuple, batches: Iterator[pa.RecordBatch],
            idle_s: float, jvm_pid: int | None = None) -> list[Any] | None:
    """`work(*args, batches)` (a module-level function: publish.publish_slot_here) run by the
    service of `tid` on this executor, which returns its results. None when no service took the
    task (none running yet: one is started for the next batch; or busy): the caller runs `work`
    in this worker then, and nothing of `batches` has been consumed. The service exits after
    `idle_s` without a task."""
    jvm = jvm_pid or executor_pid()
    if jvm is None:
        return None
    name = address(jvm, tid)
    sock = connect(name)
    if sock is None:
        _start(name, jvm)
        return None
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        header = (work, args, sidefile.current_task_attempt(), idle_s)
        _send(sock, b"H", pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))
        answer = _recv_exactly(sock, 1)
    except (OSError, ConnectionError):
        sock.close()
        return None   # not taken: nothing was consumed, the worker publishes
    if answer != READY:
        sock.close()
        return None
    try:
        sock.settimeout(None)   # the driver's batch watchdog bounds the task from here on
        schema_sent = False
        for batch in batches:
            if not schema_sent:
                _send(sock, SCHEMA, batch.schema.serialize())
                schema_sent = True
            _send(sock, BATCH, batch.serialize())
        _send(sock, END)
        kind, payload = _recv(sock)
    except (OSError, ConnectionError) as exc:
        raise InfrastructureError(
            f"the publisher service of {tid} on this executor went away mid-task ({exc}); "
            "the next attempt's init_transactions settles its transaction") from exc
    finally:
        sock.close()
    answer = pickle.loads(payload)
    if kind == b"R":
        return answer
    raise _rebuilt(answer)


def started(name: bytes) -> subprocess.Popen | None:
    """The service this process started under `name`, if it did (tests, diagnostics)."""
    entry = _SPAWNED.get(name)
    return entry[0] if entry else None


def connect(name: bytes) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
        return sock
    except OSError:
        sock.close()
        return None


def _start(name: bytes, jvm_pid: int) -> None:
    """Start the service for `name` in the background (this worker's process group: pyspark's
    daemon hangs up on the whole group when it stops). Two starters race harmlessly: the second
    service cannot bind the name and exits."""
    now = time.monotonic()
    for proc, _ in _SPAWNED.values():
        proc.poll()   # reaps a service that has exited
    previous = _SPAWNED.get(name)
    if previous is not None and (previous[0].poll() is None or now - previous[1] < RESPAWN_AFTER_S):
        return
    env = dict(os.environ)
    # The worker may see txstream through a path Spark added at run time (a shipped zip).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.exists(p))
    proc = subprocess.Popen(
        [sys.executable, "-m", "txstream.task.publisher_service", name[1:].decode(), str(jvm_pid)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
    _SPAWNED[name] = (proc, now)


def _portable(exc: BaseException) -> tuple[str, str, str, bytes | None]:
    """An exception the task can raise again with its type and message (txstream's own types
    keep their meaning for the driver, errors.from_spark)."""
    try:
        pickled: bytes | None = pickle.dumps(exc)
        pickle.loads(pickled)
    except Exception:
        pickled = None
    return type(exc).__module__, type(exc).__qualname__, str(exc), pickled


def _rebuilt(portable: tuple[str, str, str, bytes | None]) -> BaseException:
    module, qualname, message, pickled = portable
    if pickled is not None:
        exc = pickle.loads(pickled)
        if isinstance(exc, TxstreamError):
            return exc
    # Anything else was a failure of the machinery in the service: say where it happened.
    return InfrastructureError(f"publisher service: {module}.{qualname}: {message}")


# -- the service's side -------------------------------------------------------------------------

class _Service:
    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid
        self.lock = threading.Lock()
        self.client: socket.socket | None = None   # the task being served
        self.last_done = time.monotonic()
        self.idle_s = 120.0

    def serve(self, listener: socket.socket) -> None:
        threading.Thread(target=self._watch, name="watch", daemon=True).start()
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            kind, header = _recv(conn)
            work, args, attempt, idle_s = pickle.loads(header)
        except Exception:
            conn.close()
            return
        with self.lock:
            if self.client is not None:
                _send_quietly(conn, BUSY)
                conn.close()
                return
            self.client = conn
        try:
            self.idle_s = idle_s
            conn.sendall(READY)
            incoming = _batches_from(conn)
            try:
                with sidefile.serving_task_attempt(attempt):   # the reader's side files are the task's
                    reply = (b"R", work(*args, incoming))
            except BaseException as exc:   # to the task, which raises it as its own
                traceback.print_exc()
                reply = (b"X", _portable(exc))
            # An early outcome (a stale plan, a slot already published, an error) leaves rows
            # unread that the task is still sending: read them to the end, then answer.
            for _ in incoming:
                pass
            self._done()   # before the reply: the task closing the connection then is no hang-up
            _send(conn, reply[0], pickle.dumps(reply[1], protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass   # the task is gone; the watcher ends this process
        finally:
            conn.close()
            self._done()

    def _done(self) -> None:
        with self.lock:
            self.client = None
            self.last_done = time.monotonic()

    def _watch(self) -> None:
        """Exit when the task being served is gone, the executor is gone, or nothing came for
        idle_s: a producer that outlives its reason would hold its transactional.id for nothing."""
        from txstream.task import publish

        while True:
            time.sleep(WATCH_INTERVAL_S)
            with self.lock:
                client, idle = self.client, time.monotonic() - self.last_done
            if client is not None and _hung_up(client):
                os._exit(3)   # like the task's worker, killed mid-transaction
            if not _alive(self.jvm_pid):
                os._exit(0)
            if client is None and idle > self.idle_s:
                with self.lock:
                    if self.client is None:
                        for tid in publish.cached_publishers():
                            publish.drop_publisher(tid)
                        os._exit(0)


def _batches_from(conn: socket.socket) -> Iterator[pa.RecordBatch]:
    schema = None
    while True:
        kind, payload = _recv(conn)
        if kind == END:
            return
        if kind == SCHEMA:
            schema = pa.ipc.read_schema(pa.py_buffer(payload))
        elif kind == BATCH:
            yield pa.ipc.read_record_batch(pa.py_buffer(payload), schema)
        else:
            raise InfrastructureError(f"publisher service: unexpected frame {kind!r}")


def _alive(pid: int) -> bool:
    """A process that has not exited (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _hung_up(conn: socket.socket) -> bool:
    poller = select.poll()
    poller.register(conn, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    name, jvm_pid = b"\0" + argv[0].encode(), int(argv[1])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:
        return 0   # another task started this service first
    listener.listen(8)
    import gc

    from txstream.task import publish  # noqa: F401 - loaded before the first task arrives

    gc.freeze()
    _Service(jvm_pid).serve(listener)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
