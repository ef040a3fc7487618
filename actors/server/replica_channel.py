"""The local channel between a broker's process and its partition replica actors.

A Ray actor call costs about 1 ms of CPU on this kind of machine (docs/dataplane.md); a
request on a Unix-domain socket costs tens of microseconds. A PartitionReplica therefore
serves its data-plane requests (produce, consumer fetch) on a socket of its own as well as
through Ray: ``ReplicaChannelServer`` runs in the replica's process, ``ReplicaChannel`` is
the broker-side end (the Kafka listener's request handlers, a follower broker's fetcher).
Ray stays the control plane: the replica's address is asked once through Ray
(``PartitionReplica.channel_address``), and a replica that dies closes its sockets, which
fails every request in flight on them at once (never a hang).

Address: a Linux abstract Unix socket named ``raykafka/<random hex>``: nothing on disk to
clean up after a killed replica, a new name for every incarnation (a restarted replica is
never mistaken for its predecessor), and only processes of the same user are served (the
peer's uid is checked with SO_PEERCRED at accept).

Frames (little-endian; private to this module and versioned by nothing but the code both
ends run, since both ends are started from one installation):

    request   u32 size (of what follows) | u32 request id | u8 op | body
      PRODUCE   i8 acks | i32 timeout_ms | record batches (the rest)
      FETCH     i64 offset | i32 max_bytes | i32 max_wait_ms | i32 min_bytes | u8 isolation
      WATCH     (nothing)
      POSITION  i32 follower_id | i32 leader_epoch | i64 offset  (no response: a follower
                broker's fetch the leader's broker answered from the tail it caches)
      REPLICA_FETCH  i32 follower_id | i32 leader_epoch | i64 offset | i32 max_bytes
                (a follower broker's fetch, relayed by the leader's broker: records the
                follower's position, never waits: the broker's purgatory does)
      APPLY     i64 generation | i64 fetch_offset | i64 high_watermark | i64 log_start_offset
                | record batches (what the leader sent, for this follower replica to append)
      HW        as APPLY without batches (no response: the leader's HW and log start for a
                follower whose fetch brought no records; the fetcher does not wait for it,
                and a replica that moved on shows in the next APPLY's answer)
      LIST_OFFSET  i64 timestamp [| u8 from_follower] (ListOffsets at the leader: -1
                latest, -2 earliest, -3 the largest timestamp, else the first record at or
                after it; latest is the high watermark, or the log end offset when
                from_follower is 1: a follower broker's ListOffsets, as Kafka answers a
                request with a replica id)
      EPOCH_END    i32 leader_epoch (OffsetForLeaderEpoch at the leader, KIP-101)
      FOLLOWER     u8 call | i64 generation | i64 argument: a follower replica's side of a
                truncation (KIP-101/279), asked by its broker's fetcher once per leader
                change: call 0 its (log end, HW), 1 its latest leader epoch, 2 the end
                offset of epoch ``argument``, 3 truncate to ``argument``, 4 truncate fully
                and start at ``argument``
    response  u32 size | u32 request id | u8 status | body
      OK PRODUCE  i64 base_offset | i64 last_offset | i64 log_append_time_ms
                  | i64 log_start_offset
      OK FETCH    i64 high_watermark | i64 log_start_offset | i64 log_end_offset | batches
      OK WATCH    i64 high_watermark | i64 log_end_offset | i64 log_start_offset
                  | i64 leadership | i64 base | i64 end | batches [base, end): first at
                  once (no batches, base = end = the LEO), then again (same request id)
                  whenever the HW, the LEO or the leadership changes, until the connection
                  ends; the batches are the log's tail, each push starting where the last
                  ended (at most TAIL_PUSH_BYTES of them per push, so a long tail comes in
                  several), so the broker holds the partition's newest records without
                  asking for them
      OK REPLICA_FETCH  as OK FETCH
      OK APPLY    i64 log_end_offset | i64 high_watermark after the append (-1, -1: the
                  replica moved on from that generation; nothing was appended)
      OK LIST_OFFSET  i64 timestamp | i64 offset ((-1, -1): no such record)
      OK EPOCH_END    i32 leader_epoch | i64 end_offset ((-1, -1): unknown)
      OK FOLLOWER     u8 answered | i64 a | i64 b (answered 0: the replica moved on from
                      that generation; else 0: (a, b), 1: a, 2: (a, b), 3 and 4: a = 1 when done)
      ERROR       u16 class-name size | class name (an actors.errors class) | message

Ordering: a connection's produce and apply requests are appended in the order they arrive (the
append runs on the connection's reader thread; only an acks=all wait for the ISR moves to
a worker thread), so a broker that forwards one client connection's requests in order keeps
Kafka's per-partition ordering. Fetches run on worker threads (long polls park there);
responses carry the request id and may come back in any order. A watch parks one thread
on the replica's change condition (woken by appends, HW moves, role changes and the end of
its connection, never by a timer): a broker's purgatory learns there that data arrived.

Bounds: a frame larger than ``max_frame_bytes`` closes the connection before anything is
allocated for it; at most ``max_workers`` requests wait at once per replica (the rest queue).
"""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import logging
import os
import socket
import struct
import threading
import time
from typing import NamedTuple

from .. import errors as _errors
from .. import hoptrace
from ..connection import IOV_MAX, consume_sent, set_receive_timeout
from ..errors import KafkaError, KafkaTimeoutError, NotLeaderForPartitionError
from ..protocol import EpochEndOffset, FetchResult, ProduceResult, ReplicaFetchResult

PRODUCE = 1
FETCH = 2
WATCH = 3
REPLICA_FETCH = 4
APPLY = 5
POSITION = 6
HW = 7
LIST_OFFSET = 8
EPOCH_END = 9
FOLLOWER = 10
# FOLLOWER's calls
F_POSITION, F_LATEST_EPOCH, F_EPOCH_END, F_TRUNCATE, F_TRUNCATE_FULLY = range(5)
OK = 0
ERROR = 1
ISOLATION = {"high_watermark": 0, "log_end": 1}
_ISOLATION_NAMES = {v: k for k, v in ISOLATION.items()}

_SIZE = struct.Struct("<I")
_REQ = struct.Struct("<IIB")           # size, request id, op
_RESP = struct.Struct("<IIB")          # size, request id, status
_PRODUCE = struct.Struct("<bi")        # acks, timeout_ms
_FETCH = struct.Struct("<qiiiB")       # offset, max_bytes, max_wait_ms, min_bytes, isolation
_PRODUCED = struct.Struct("<qqqq")     # base, last, log_append_time, log_start
_FETCHED = struct.Struct("<qqq")       # hw, log_start, log_end
_WATCHED = struct.Struct("<qqqqqq")    # hw, log_end, log_start, leadership, base, end
_POSITION = struct.Struct("<iiq")      # follower_id, leader_epoch, offset
_REPLICA_FETCH = struct.Struct("<iiqi")  # follower_id, leader_epoch, offset, max_bytes
_APPLY = struct.Struct("<qqqq")        # generation, fetch_offset, hw, log_start
_APPLIED = struct.Struct("<qq")        # log_end, hw
_TIMESTAMP = struct.Struct("<q")       # a ListOffsets timestamp
_FROM_FOLLOWER = struct.Struct("<qB")  # a ListOffsets timestamp, from a follower
_LISTED = struct.Struct("<qq")         # timestamp, offset
_EPOCH = struct.Struct("<i")           # leader_epoch
_EPOCH_END = struct.Struct("<iq")      # leader_epoch, end_offset
_FOLLOWER = struct.Struct("<Bqq")       # call, generation, argument
_FOLLOWED = struct.Struct("<Bqq")       # answered, a, b
_NAME = struct.Struct("<H")

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_BYTES = 128 << 20    # above message.max.bytes of any sane topic
DEFAULT_MAX_WORKERS = 8                # as the replica actor's max_concurrency
TAIL_PUSH_BYTES = 256 << 10            # batches per watch push, at most about this much
_READ_CHUNK = 64 << 10                 # loop: one read takes up to this; larger frames are
                                       # read into a buffer of their own


class WatchEvent(NamedTuple):
    """One push of a watch: the replica's offsets and leadership, and the log's batches
    from ``base`` to ``end`` (empty when nothing was appended since the last push)."""

    high_watermark: int
    log_end_offset: int
    log_start_offset: int
    leadership: int
    base: int
    end: int
    data: memoryview


def _recv_into(sock: socket.socket, view: memoryview, frame_size: int) -> bool:
    """Fill ``view`` (the rest of a ``frame_size``-byte frame) from ``sock``; False at a
    clean end of stream before any byte, ConnectionError at one inside the frame."""
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0 and len(view) == frame_size:
                return False
            raise ConnectionError(f"connection closed {frame_size - len(view) + got} bytes "
                                  f"into a {frame_size}-byte frame")
        got += k
    return True


def _recv_exactly(sock: socket.socket, n: int) -> bytearray | None:
    """``n`` bytes from ``sock`` into one buffer; None at a clean end of stream before any."""
    buf = bytearray(n)
    return buf if _recv_into(sock, memoryview(buf), n) else None


def _error_frame(request_id: int, exc: BaseException) -> list:
    cls = type(exc) if isinstance(exc, KafkaError) else KafkaError
    name = cls.__name__.encode()
    text = str(exc).encode("utf-8", "replace")
    size = 4 + 1 + _NAME.size + len(name) + len(text)
    return [_RESP.pack(size, request_id, ERROR) + _NAME.pack(len(name)) + name + text]


def _raise_error(body: memoryview) -> None:
    (n,) = _NAME.unpack_from(body, 0)
    name = bytes(body[_NAME.size:_NAME.size + n]).decode()
    text = bytes(body[_NAME.size + n:]).decode("utf-8", "replace")
    cls = getattr(_errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, KafkaError)):
        cls = KafkaError
    raise cls(text)


class ReplicaChannelServer:
    """The replica's end: an accept thread and one reader thread per connection, serving
    ``replica`` (a PartitionReplica: ``append_as_leader``, ``acked``, ``await_acks``,
    ``fetch``, ``watch_state``, ``tail``, ``listen``).
    Thread-safe; ``close`` ends every connection and waits for nothing else."""

    def __init__(self, replica, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_workers: int = DEFAULT_MAX_WORKERS):
        self.replica = replica
        self.max_frame_bytes = max_frame_bytes
        self.address = "\0raykafka/" + os.urandom(12).hex()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(16)
        self._uid = os.getuid()
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix="channel-work")
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        # acks=all answers: ready ones are sent by the reader thread whose request made
        # them ready, else by the acks thread (also the one that expires them)
        self._acks_cond = threading.Condition()
        self._acks_ready: collections.deque = collections.deque()
        self._acks_deadlines: list[float] = []          # heap of the waits' deadlines
        self._reader = threading.local()
        threading.Thread(target=self._acks_loop, daemon=True, name="channel-acks").start()
        threading.Thread(target=self._accept_loop, daemon=True,
                         name="channel-accept").start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        with self._acks_cond:
            self._acks_cond.notify()
        for s in [self._sock, *conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return                                   # closed
            uid = struct.unpack("3i", conn.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            with self._lock:
                if self._closed or uid != self._uid:
                    conn.close()
                    continue
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="channel-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        self._reader.active = True
        send_lock = threading.Lock()
        watches: list[_Watch] = []
        ended = threading.Event()                       # watches of this connection stop

        reader = threading.current_thread()
        corked: list = []       # the reader's answers and pushes of this read, sent at once
        cork = [False, False]   # corked; a request was handled since the last flush

        def send(parts: list) -> None:
            if cork[0] and threading.current_thread() is reader:
                corked.extend(parts)
                return
            if hoptrace.DIR:
                hoptrace.hop("S>")
            with send_lock:
                try:
                    if len(parts) == 1:
                        conn.sendall(parts[0])
                        return
                    sent = conn.sendmsg(parts[:IOV_MAX])
                    total = sum(len(p) for p in parts)
                    if sent < total:         # a short send (a signal): finish it, in order
                        conn.sendall(b"".join(bytes(p) for p in parts)[sent:])
                except OSError:
                    pass                                 # the reader sees the end

        def flush() -> None:
            """The answers made ready by this read (acks=all ones too), then one push per
            watch of what the requests changed, in ONE message: the broker is woken once
            per read, not once per answer. The watches' locks are held until it is sent,
            so a watch thread never sends a newer state ahead of this one."""
            if self._acks_ready:
                self._send_acks()
            pushing = watches if cork[1] else ()
            for watch in pushing:
                watch.lock.acquire()
            try:
                for watch in pushing:
                    watch.push_locked(self.replica)
                out = corked[:]
                corked.clear()
                cork[0] = cork[1] = False
                if out:
                    send(out)
            finally:
                for watch in pushing:
                    watch.lock.release()

        try:
            rest = b""
            while True:
                data = conn.recv(_READ_CHUNK)
                if not data:
                    return
                if rest:
                    data, rest = rest + data, b""
                pos, end = 0, len(data)
                cork[0] = True
                while end - pos >= _SIZE.size:
                    (size,) = _SIZE.unpack_from(data, pos)
                    if size < 5 or size > self.max_frame_bytes:
                        return                           # refused before allocating
                    start = pos + _SIZE.size
                    if start + size <= end:
                        frame = data[start:start + size]
                        pos = start + size
                    else:                # the rest of a large frame: straight into its buffer
                        frame = bytearray(size)
                        frame[:end - start] = memoryview(data)[start:end]
                        flush()                  # what is ready does not wait for it
                        cork[0] = True
                        _recv_into(conn, memoryview(frame)[end - start:], size)
                        pos = end
                    request_id, op = struct.unpack_from("<IB", frame, 0)
                    if hoptrace.DIR:
                        hoptrace.hop(f"S<{op}")
                    if op == WATCH:
                        watch = _Watch(request_id, send, reader)
                        watches.append(watch)
                        threading.Thread(target=self._watch, args=(watch, ended),
                                         daemon=True, name="channel-watch").start()
                        continue
                    cork[1] = True
                    self._handle(request_id, op, memoryview(frame)[5:], send)
                rest = data[pos:]
                flush()
        except (OSError, ConnectionError):
            return
        finally:
            ended.set()
            for watch in watches:
                watch.changed.set()
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handle(self, request_id: int, op: int, body: memoryview, send) -> None:
        try:
            if op == PRODUCE:
                acks, timeout_ms = _PRODUCE.unpack_from(body, 0)
                batch = body[_PRODUCE.size:]
                # the append here, in arrival order; only the wait for the ISR elsewhere
                result, leadership = self.replica.append_as_leader(batch, acks)
                if acks == -1 and not self.replica.acked(result.last_offset):
                    deadline = self.replica.when_acked(
                        result.last_offset, leadership, timeout_ms,
                        lambda outcome: self._acked(request_id, result, outcome, send))
                    if deadline is not None:
                        with self._acks_cond:
                            heapq.heappush(self._acks_deadlines, deadline)
                            if self._acks_deadlines[0] == deadline:
                                self._acks_cond.notify()     # an earlier wake-up
                    return
                send(self._produced(request_id, result))
            elif op == FETCH:
                offset, max_bytes, max_wait_ms, min_bytes, iso = _FETCH.unpack_from(body, 0)
                args = (offset, max_bytes, max_wait_ms, min_bytes, _ISOLATION_NAMES[iso])
                if max_wait_ms > 0:
                    self._workers.submit(self._fetch, request_id, args, send)
                else:
                    self._fetch(request_id, args, send)
            elif op == REPLICA_FETCH:
                follower, epoch, offset, max_bytes = _REPLICA_FETCH.unpack_from(body, 0)
                r = self.replica.replica_fetch(follower, offset, epoch, max_bytes, 0)
                send(self._fetched(request_id, r))
            elif op == POSITION:
                follower, epoch, offset = _POSITION.unpack_from(body, 0)
                try:
                    self.replica.follower_fetched(follower, offset, epoch)
                except KafkaError as exc:     # no one waits for an answer: the next fetch
                    log.debug("replica channel: position of follower %d refused: %s",
                              follower, exc)      # (through the broker) gets the refusal
            elif op == APPLY:
                generation, offset, hw, start = _APPLY.unpack_from(body, 0)
                data = body[_APPLY.size:]
                applied = self.replica.apply_fetch(
                    generation, offset, ReplicaFetchResult(data, hw, start, -1))
                position = self.replica.follower_position(generation) if applied else None
                answer = _APPLIED.pack(*(position or (-1, -1)))
                send([_RESP.pack(5 + len(answer), request_id, OK) + answer])
            elif op == HW:
                generation, offset, hw, start = _APPLY.unpack_from(body, 0)
                try:
                    self.replica.apply_fetch(generation, offset,
                                             ReplicaFetchResult(b"", hw, start, -1))
                except Exception as exc:  # noqa: BLE001 - never answered (a frame nobody
                    # waits for would fail a fetcher's channel): the next APPLY shows it
                    log.debug("replica channel: HW %d refused: %s", hw, exc)
            elif op == LIST_OFFSET:
                (timestamp,) = _TIMESTAMP.unpack_from(body, 0)
                follower = len(body) >= _FROM_FOLLOWER.size and body[_TIMESTAMP.size] == 1
                answer = _LISTED.pack(*self.replica.list_offset(timestamp,
                                                                from_follower=follower))
                send([_RESP.pack(5 + len(answer), request_id, OK) + answer])
            elif op == EPOCH_END:
                (epoch,) = _EPOCH.unpack_from(body, 0)
                found = self.replica.offsets_for_leader_epoch(epoch)
                answer = _EPOCH_END.pack(found.leader_epoch, found.end_offset)
                send([_RESP.pack(5 + len(answer), request_id, OK) + answer])
            elif op == FOLLOWER:
                answer = _FOLLOWED.pack(*self._follower_call(*_FOLLOWER.unpack_from(body, 0)))
                send([_RESP.pack(5 + len(answer), request_id, OK) + answer])
            else:
                raise KafkaError(f"unknown channel op {op}")
        except Exception as exc:  # noqa: BLE001 - every failure is the requester's answer
            send(_error_frame(request_id, exc))

    def _follower_call(self, call: int, generation: int, argument: int) -> tuple:
        """FOLLOWER: (answered, a, b) of the follower replica's truncation call."""
        replica = self.replica
        if call == F_POSITION:
            found = replica.follower_position(generation)
        elif call == F_LATEST_EPOCH:
            epoch = replica.latest_epoch(generation)
            found = None if epoch is None else (epoch, 0)
        elif call == F_EPOCH_END:
            found = replica.epoch_end_offset(generation, argument)
        elif call == F_TRUNCATE:
            found = (1, 0) if replica.truncate(generation, argument) else None
        elif call == F_TRUNCATE_FULLY:
            found = (1, 0) if replica.truncate_fully(generation, argument) else None
        else:
            raise KafkaError(f"unknown follower call {call}")
        return (0, 0, 0) if found is None else (1, *found)

    @staticmethod
    def _produced(request_id: int, result: ProduceResult) -> list:
        body = _PRODUCED.pack(result.base_offset, result.last_offset,
                              result.log_append_time_ms, result.log_start_offset)
        return [_RESP.pack(5 + len(body), request_id, OK) + body]

    def _acked(self, request_id, result, outcome, send) -> None:
        """``when_acked``'s callback (under the replica's lock: only queue the answer). On
        one of this server's reader threads the answer goes out when its request is done;
        from anywhere else (an ISR change, a Ray call) the acks thread sends it."""
        self._acks_ready.append((request_id, result, outcome, send))
        if not getattr(self._reader, "active", False):
            with self._acks_cond:
                self._acks_cond.notify()

    def _send_acks(self) -> None:
        while True:
            try:
                request_id, result, outcome, send = self._acks_ready.popleft()
            except IndexError:
                return
            send(self._produced(request_id, result) if outcome is True
                 else _error_frame(request_id, outcome))

    def _acks_loop(self) -> None:
        """Sends answers made ready off the reader threads, and ends the waits past their
        deadline. Sleeps while nothing waits: no timer runs for an idle replica."""
        while True:
            with self._acks_cond:
                while not self._acks_ready and not self._closed:
                    if self._acks_deadlines:
                        due = self._acks_deadlines[0] - time.monotonic()
                        if due <= 0:
                            heapq.heappop(self._acks_deadlines)
                            break
                        self._acks_cond.wait(due)
                    else:
                        self._acks_cond.wait()
                if self._closed:
                    return
            self.replica.expire_acks()
            self._send_acks()

    def _watch(self, watch: "_Watch", ended: threading.Event) -> None:
        """The watch's own thread: pushes the changes nobody else pushed (made off this
        connection's reader thread: other connections, Ray calls, the ISR thread)."""
        unlisten = self.replica.listen(watch.changed_by)
        try:
            while True:
                watch.changed.wait()
                watch.changed.clear()
                if ended.is_set():
                    return
                try:
                    self.replica.watch_state()          # raises once it stopped
                except Exception as exc:  # noqa: BLE001 - the replica stopped: say so, end
                    watch.send(_error_frame(watch.request_id, exc))
                    return
                watch.push(self.replica)
        finally:
            unlisten()

    def _fetch(self, request_id, args, send) -> None:
        try:
            r = self.replica.fetch(*args[:4], isolation=args[4])
        except Exception as exc:  # noqa: BLE001
            send(_error_frame(request_id, exc))
            return
        send(self._fetched(request_id, r))

    @staticmethod
    def _fetched(request_id: int, r) -> list:
        head = _FETCHED.pack(r.high_watermark, r.log_start_offset, r.log_end_offset)
        return [_RESP.pack(5 + len(head) + len(r.data), request_id, OK) + head, r.data]


class _Watch:
    """One watch of a connection: what it last pushed. Pushed by the connection's reader
    thread right after a request that changed the replica (an append, a follower's
    position), and by the watch's own thread for changes made elsewhere (other
    connections, Ray calls, the ISR thread). The watch's thread is woken only for those:
    the replica's listener (``changed_by``) skips changes made on the reader thread, which
    pushes them itself, so an append costs no thread switch (measured: the woken watch
    thread and the reader then took turns on the GIL and on this watch's lock for every
    append, about a fifth of the replica's CPU at RF=1)."""

    def __init__(self, request_id: int, send, reader: threading.Thread):
        self.request_id = request_id
        self.send = send
        self.reader = reader
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.changed.set()                  # the first push: the state as it is
        self.seen: tuple[int, int, int] | None = None     # (hw, pushed end, leadership)
        self.pushed: int | None = None

    def changed_by(self) -> None:
        """The replica's listener (under its lock): wake the watch's thread unless the
        change is the reader thread's, which pushes after every request it handles."""
        if threading.current_thread() is not self.reader:
            self.changed.set()

    def push(self, replica) -> None:
        """Push what changed since the last push (read now, under this watch's lock, so two
        pushers never send a state older than one already sent). A push that stopped at
        TAIL_PUSH_BYTES leaves the rest to the watch's thread."""
        with self.lock:
            self.push_locked(replica)

    def push_locked(self, replica) -> None:
        """``push`` with this watch's lock held by the caller (which sends what ``send``
        queued before it lets go of the lock)."""
        try:
            hw, leo, start, leadership = replica.watch_state()
            if (hw, leo, leadership) == self.seen:
                return
            pushed = self.pushed
            base = leo if pushed is None or pushed > leo or pushed < start else pushed
            data, end = replica.tail(base, TAIL_PUSH_BYTES) if base < leo else (b"", base)
        except Exception:  # noqa: BLE001 - the replica is stopping: its thread says so
            return
        self.pushed, self.seen = end, (hw, end, leadership)
        head = _WATCHED.pack(hw, leo, start, leadership, base, end)
        self.send([_RESP.pack(5 + len(head) + len(data), self.request_id, OK) + head,
                   data] if data else
                  [_RESP.pack(5 + len(head), self.request_id, OK) + head])
        if end < leo:
            self.changed.set()


class ReplicaChannel:
    """The broker's end of one replica's channel: requests return
    ``concurrent.futures.Future`` objects (ProduceResult / FetchResult, or the replica's
    typed error). Thread-safe. When the connection ends (the replica died or stopped),
    every request in flight fails with NotLeaderForPartitionError, as does every later one:
    the caller asks Ray for the replica's current address and opens a new channel.

    ``reader_thread=False`` is for a channel one thread owns (a follower broker's fetcher
    applying what it fetched): no reader thread; the owner reads each answer itself with
    ``result(future, timeout_s)``, which saves a thread hand-off per request. Such a
    channel carries no watch, and a failed send or a late answer fails the whole channel
    (a frame cut short would leave the stream undecodable).

    ``loop`` (a listener's ``network.SocketServer``) serves the channel on that listener's
    network thread instead of a thread of its own: answers and watch pushes are read there
    (futures complete and watch callbacks run on it, so a Kafka answer they finish is
    written without a hand-over to that thread), and every send is non-blocking: what the
    socket does not take at once waits, in order, for the network thread to write it when
    the socket has room. No send may block there: the replica may be blocked writing to
    this very thread (see ``_send_lock``). A failed send fails the whole channel."""

    def __init__(self, address: str, *, connect_timeout_s: float = 5.0,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, reader_thread: bool = True,
                 loop=None):
        self.address = address
        self.max_frame_bytes = max_frame_bytes
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(connect_timeout_s)
        try:
            self._sock.connect(address)
        except OSError as exc:
            self._sock.close()
            raise NotLeaderForPartitionError(
                f"replica channel {address[1:]!r} refused the connection: {exc}") from None
        self._sock.settimeout(None)
        # Two locks: _lock guards the ids, the pending map and the watchers, and the reader
        # takes it for every answer; _send_lock keeps each frame whole on the socket. A
        # send can block (the replica is not reading: its own send to us is blocked), so it
        # never holds _lock: a reader waiting for a blocked sender would stop reading what
        # the replica sends, and the replica would stop reading what we send (a deadlock of
        # both sides, seen with 1 MB produces while the watch pushed tails).
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._deferred: list[bytes] = []            # one-way frames for the sender thread
        self._deferring = False                     # frames queued or being sent
        self._deferred_ready = threading.Condition(self._lock)
        self._sender: threading.Thread | None = None
        self._pending: dict[int, tuple[int, concurrent.futures.Future]] = {}
        self._watchers: dict[int, object] = {}     # watch request id -> callback
        self._next_id = 0
        self._dead: BaseException | None = None
        self._inline = loop is None and not reader_thread
        self._read_lock = threading.Lock()          # inline: one reader at a time
        self._read_timeout_s: float | None = None   # inline: the socket's SO_RCVTIMEO
        self._loop = loop
        self._out: list = []            # loop: what the socket has not taken yet, in order
        self._rest = b""                # loop: bytes read past the last whole frame
        self._big: bytearray | None = None          # loop: a large frame being filled
        self._big_got = 0
        if loop is not None:
            self._sock.setblocking(False)
            try:
                loop.attach(self._sock, self)
            except RuntimeError as exc:
                self._sock.close()
                raise NotLeaderForPartitionError(
                    f"replica channel {address[1:]!r}: {exc}") from None
        elif reader_thread:
            threading.Thread(target=self._read_loop, daemon=True, name="channel-read").start()

    @property
    def alive(self) -> bool:
        return self._dead is None

    def produce(self, batch, acks: int = -1, timeout_ms: int = 30000
                ) -> concurrent.futures.Future:
        return self._request(PRODUCE, [_PRODUCE.pack(acks, timeout_ms)], batch)

    def fetch(self, offset: int, max_bytes: int = 1 << 20, max_wait_ms: int = 0,
              min_bytes: int = 1, *, isolation: str = "high_watermark"
              ) -> concurrent.futures.Future:
        head = _FETCH.pack(offset, max_bytes, max_wait_ms, min_bytes, ISOLATION[isolation])
        return self._request(FETCH, [head], None)

    def list_offset(self, timestamp: int, *, from_follower: bool = False
                    ) -> concurrent.futures.Future:
        """ListOffsets at this leader replica: a future of (timestamp, offset); latest
        (-1) is the log end offset instead of the HW ``from_follower``."""
        head = _FROM_FOLLOWER.pack(timestamp, 1) if from_follower \
            else _TIMESTAMP.pack(timestamp)
        return self._request(LIST_OFFSET, [head], None)

    def end_offset_for_epoch(self, leader_epoch: int) -> concurrent.futures.Future:
        """OffsetForLeaderEpoch at this leader replica: a future of an EpochEndOffset."""
        return self._request(EPOCH_END, [_EPOCH.pack(leader_epoch)], None)

    def follower_call(self, call: int, generation: int, argument: int = 0
                      ) -> concurrent.futures.Future:
        """A follower replica's truncation call (FOLLOWER, ``F_*``): a future of (a, b), or
        None when the replica moved on from ``generation``."""
        return self._request(FOLLOWER, [_FOLLOWER.pack(call, generation, argument)], None)

    def replica_fetch(self, follower_id: int, leader_epoch: int, offset: int,
                      max_bytes: int) -> concurrent.futures.Future:
        """A follower broker's fetch at ``offset`` (its replica's LEO), relayed to this
        leader replica: a ReplicaFetchResult, at once (the waiting is the caller's)."""
        head = _REPLICA_FETCH.pack(follower_id, leader_epoch, offset, max_bytes)
        return self._request(REPLICA_FETCH, [head], None)

    def apply(self, generation: int, fetch_offset: int, high_watermark: int,
              log_start_offset: int, records) -> concurrent.futures.Future:
        """Hand what the leader sent to this follower replica (appended in the order the
        channel's applies arrive): its (log end offset, high watermark) afterwards, or
        None when it no longer follows in ``generation``."""
        head = _APPLY.pack(generation, fetch_offset, high_watermark, log_start_offset)
        return self._request(APPLY, [head], records)

    def high_watermark(self, generation: int, fetch_offset: int, high_watermark: int,
                       log_start_offset: int) -> None:
        """Tell this follower replica the leader's HW and log start when a fetch brought
        it no records (no answer: what the replica could refuse, the next ``apply``
        answers)."""
        head = _APPLY.pack(generation, fetch_offset, high_watermark, log_start_offset)
        self._request(HW, [head], None, answered=False)

    def position(self, follower_id: int, leader_epoch: int, offset: int) -> None:
        """Tell this leader replica a follower fetched at ``offset`` (no answer: a refusal
        shows in the follower's next fetch the broker cannot answer from its cache).

        Never blocks: it runs on channel reader threads (a follower's fetch completed by a
        watch push), and a reader that waits for a send waits for a replica that may be
        waiting for that reader (see _send_lock). Sent at once when the socket takes it
        without waiting, else queued for the channel's sender thread; reports stay in
        call order."""
        body = _POSITION.pack(follower_id, leader_epoch, offset)
        with self._lock:
            if self._dead is not None:
                return
            request_id = self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            frame = _REQ.pack(5 + len(body), request_id, POSITION) + body
            queued = self._deferring
        if self._loop is not None:
            self._send_nowait([frame])
            return
        if not queued and self._send_lock.acquire(blocking=False):
            try:
                sent = self._sock.send(frame, socket.MSG_DONTWAIT)
                if sent == len(frame):
                    return
                if sent:                  # (a few bytes into a stream socket: not seen)
                    self._sock.sendall(frame[sent:])
                    return
            except BlockingIOError:
                pass
            except OSError:
                return                    # the channel is failing: its reader says so
            finally:
                self._send_lock.release()
        self._defer(frame)

    def _defer(self, frame: bytes) -> None:
        with self._lock:
            if self._dead is not None:
                return
            self._deferred.append(frame)
            self._deferring = True
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_deferred, daemon=True,
                                                name="channel-send")
                self._sender.start()
            self._deferred_ready.notify()

    def _send_deferred(self) -> None:
        """The sender thread: writes queued one-way frames in order (it may wait on the
        socket; no reader waits for it)."""
        while True:
            with self._lock:
                while not self._deferred and self._dead is None:
                    self._deferring = False
                    self._deferred_ready.wait()
                if self._dead is not None:
                    return
                frames, self._deferred = self._deferred, []
            try:
                with self._send_lock:
                    self._sock.sendall(b"".join(frames))
            except OSError:
                return                    # the reader fails the channel

    def watch(self, callback) -> concurrent.futures.Future:
        """Have the replica tell this channel whenever its high watermark, log end offset
        or leadership changes, with the batches appended since the last push:
        ``callback(WatchEvent)`` runs on the channel's reader thread (keep it quick), once
        at once and then after each change (changes close together may come as one
        call). The future answers when the watch is in place; the watch ends with the
        channel."""
        if self._inline:
            raise ValueError("a channel without a reader thread carries no watch")
        return self._request(WATCH, [], None, watcher=callback)

    def close(self) -> None:
        self._fail(NotLeaderForPartitionError(f"replica channel {self.address[1:]!r} closed"))

    def _request(self, op: int, parts: list, payload, watcher=None, answered: bool = True
                 ) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        size = 5 + sum(len(p) for p in parts) + (len(payload) if payload is not None else 0)
        if size > self.max_frame_bytes:
            future.set_exception(_errors.RecordTooLargeError(
                f"a request of {size} bytes exceeds the channel's {self.max_frame_bytes}"))
            return future
        with self._lock:
            if self._dead is not None:
                future.set_exception(self._dead)
                return future
            request_id = self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            if answered:
                self._pending[request_id] = (op, future)
            else:
                future.set_result(None)
            if watcher is not None:
                self._watchers[request_id] = watcher
        frame = [_REQ.pack(size, request_id, op), *parts]
        if hoptrace.DIR:
            hoptrace.hop(f"R>{op}:{0 if payload is None else len(payload)}")
        if payload is not None and len(payload):
            frame.append(payload)
        if self._loop is not None:
            self._send_nowait(frame)
            return future
        try:
            with self._send_lock:
                total = sum(len(p) for p in frame)
                sent = self._sock.sendmsg(frame)
                if sent < total:                      # finish a short send, in order
                    self._sock.sendall(b"".join(bytes(p) for p in frame)[sent:])
        except OSError as exc:
            failed = NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r} failed: {exc}")
            if self._inline:
                self._fail(failed)
                return future
            with self._lock:
                self._pending.pop(request_id, None)
                self._watchers.pop(request_id, None)
            if not future.done():
                future.set_exception(failed)
        return future

    # -- served by a listener's network thread (``loop``) ---------------------------------
    def _send_nowait(self, frame: list) -> None:
        """Send a whole frame without blocking: what the socket does not take now is
        queued behind what is already waiting, and the network thread writes it."""
        failure = None
        with self._send_lock:
            if self._out:
                self._out.extend(frame)
                return
            try:
                sent = self._sock.sendmsg(frame)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                failure = exc
            if failure is None:
                consume_sent(frame, sent)
                if not frame:
                    return
                self._out = frame
        if failure is not None:
            self._fail(NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r} failed: {failure}"))
            return
        self._loop.set_writing(self._sock, True)

    def on_writable(self) -> None:
        """(network thread) Write what waits; stop asking once nothing does."""
        failure = None
        with self._send_lock:
            while self._out:
                try:
                    sent = self._sock.sendmsg(self._out[:IOV_MAX])
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:
                    failure = exc
                    break
                consume_sent(self._out, sent)
            if failure is None:
                # under the lock: a sender queueing after this asks again, after it
                self._loop.set_writing(self._sock, False)
        if failure is not None:
            self._fail(NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r} failed: {failure}"))

    def on_readable(self) -> None:
        """(network thread) Read what has come, settle every whole answer in it."""
        try:
            if self._big is not None:               # the rest of a large frame: in place
                n = self._sock.recv_into(memoryview(self._big)[self._big_got:])
                if n == 0:
                    raise ConnectionError("the replica closed it")
                self._big_got += n
                if self._big_got < len(self._big):
                    return
                frame, self._big = self._big, None
                self._deliver(frame)
                return
            data = self._sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r} failed: {exc}"))
            return
        if not data:
            self._fail(NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r}: the replica closed it"))
            return
        if self._rest:
            data, self._rest = self._rest + data, b""
        pos, end = 0, len(data)
        while end - pos >= _SIZE.size and self._dead is None:
            (size,) = _SIZE.unpack_from(data, pos)
            if size < 5 or size > self.max_frame_bytes + 64:
                self._fail(NotLeaderForPartitionError(f"bad response frame of {size} bytes"))
                return
            start = pos + _SIZE.size
            if start + size > end:
                if size > _READ_CHUNK:              # read the rest straight into its buffer
                    self._big = bytearray(size)
                    self._big[:end - start] = memoryview(data)[start:end]
                    self._big_got = end - start
                    return
                break
            self._deliver(data[start:start + size])
            pos = start + size
        self._rest = data[pos:]

    def loop_closed(self) -> None:
        """(network thread) The listener closed with this channel still on it."""
        self._fail(NotLeaderForPartitionError(
            f"replica channel {self.address[1:]!r}: the broker's listener closed"))

    def result(self, future: concurrent.futures.Future, timeout_s: float):
        """The answer of a request made on this channel (its error raised), waiting at
        most ``timeout_s`` (on a channel without a reader thread: for each read, done
        here). A late answer raises KafkaTimeoutError, and on such a channel fails it."""
        if not self._inline:
            return wait(future, timeout_s)
        with self._read_lock:
            if not future.done():
                why = None
                try:
                    if timeout_s != self._read_timeout_s:     # the kernel's, not a poll
                        set_receive_timeout(self._sock, timeout_s)
                        self._read_timeout_s = timeout_s
                    while not future.done() and why is None:
                        why = self._read_one()
                except BlockingIOError:
                    why = KafkaTimeoutError(f"replica channel {self.address[1:]!r}: no "
                                            f"answer in {timeout_s}s")
                except Exception as exc:  # noqa: BLE001 - whatever ends the reads fails it
                    why = NotLeaderForPartitionError(
                        f"replica channel {self.address[1:]!r} failed: {exc}")
                if why is not None:
                    self._fail(why)
        return future.result(0)

    def _read_one(self) -> BaseException | None:
        """Read one answer and settle its request (or run its watcher); what ends the
        channel (None while it goes on). Socket errors are the caller's."""
        head = _recv_exactly(self._sock, _SIZE.size)
        if head is None:
            return NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r}: the replica closed it")
        (size,) = _SIZE.unpack(head)
        if size < 5 or size > self.max_frame_bytes + 64:
            return NotLeaderForPartitionError(f"bad response frame of {size} bytes")
        frame = _recv_exactly(self._sock, size)
        if frame is None:
            return NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r}: the replica closed it")
        self._deliver(frame)
        return None

    def _deliver(self, frame) -> None:
        """Settle the request one answer frame (id, status, body) is for, or run its
        watcher."""
        request_id, status = struct.unpack_from("<IB", frame, 0)
        if hoptrace.DIR:
            hoptrace.hop(f"R<{status}")
        with self._lock:
            watcher = self._watchers.get(request_id) if status == OK else \
                self._watchers.pop(request_id, None)
            take = self._pending.get if watcher is not None and status == OK \
                else self._pending.pop
            op, future = take(request_id, (None, None))
        if future is None:
            return
        if watcher is not None and status == OK:
            if not future.done():
                future.set_result(None)
            try:
                watcher(WatchEvent(*_WATCHED.unpack_from(frame, 5),
                                   memoryview(frame)[5 + _WATCHED.size:]))
            except Exception:  # noqa: BLE001 - the caller's bug must not end reads
                log.exception("replica channel %r: watch callback failed", self.address[1:])
        elif not future.done():
            self._complete(op, status, memoryview(frame)[5:], future)

    def _read_loop(self) -> None:
        why: BaseException | None = None
        try:
            while why is None:
                why = self._read_one()
        except Exception as exc:  # noqa: BLE001 - whatever ends the reads fails the channel
            why = NotLeaderForPartitionError(
                f"replica channel {self.address[1:]!r} failed: {exc}")
        self._fail(why)

    @staticmethod
    def _complete(op, status, body: memoryview, future) -> None:
        try:
            if status != OK:
                _raise_error(body)
            if op == PRODUCE:
                future.set_result(ProduceResult(*_PRODUCED.unpack_from(body, 0)))
            elif op == APPLY:
                leo, hw = _APPLIED.unpack_from(body, 0)
                future.set_result(None if leo < 0 else (leo, hw))
            elif op == LIST_OFFSET:
                future.set_result(tuple(_LISTED.unpack_from(body, 0)))
            elif op == EPOCH_END:
                future.set_result(EpochEndOffset(*_EPOCH_END.unpack_from(body, 0)))
            elif op == FOLLOWER:
                answered, a, b = _FOLLOWED.unpack_from(body, 0)
                future.set_result((a, b) if answered else None)
            else:
                hw, start, end = _FETCHED.unpack_from(body, 0)
                cls = ReplicaFetchResult if op == REPLICA_FETCH else FetchResult
                # the frame is this answer's alone: its records are handed on, not copied
                future.set_result(cls(body[_FETCHED.size:], hw, start, end))
        except KafkaError as exc:
            future.set_exception(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = exc
            pending, self._pending = self._pending, {}
            self._watchers = {}
            self._deferred = []
            self._deferred_ready.notify_all()
        if self._loop is not None:
            self._loop.detach(self._sock)       # shut down now, closed on its thread
        else:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        for _, future in pending.values():
            if not future.done():
                future.set_exception(exc)


def wait(future: concurrent.futures.Future, timeout_s: float):
    """The result of a channel request, or KafkaTimeoutError after ``timeout_s``."""
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        raise KafkaTimeoutError(f"no answer from the replica channel in {timeout_s}s") from None
