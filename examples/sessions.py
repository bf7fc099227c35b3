"""Persistent client sessions for a message broker: subscriptions and undelivered messages
survive restarts.

    python examples/sessions.py /tmp/broker-sessions --clients 20 --messages 300

This is the pattern for state that is not a plain dict, written by hand with
``persistlog.open`` and ``persistlog.restore``:

* every change is an *event* (a registered dataclass: ``Subscribed``, ``Queued``,
  ``Acked``...), logged before it is applied, and ``replay`` applies events in order;
* ``enumerate_all`` (called when the log rotates) writes one ``SessionState`` per session,
  so a new log is complete by itself and older logs can be deleted;
* the classes go through a ``persistlog.Codec``: nothing is pickled, and a reader without
  the registrations sees neutral tagged values instead of running code.

The run has two lives. The first connects clients, subscribes them, publishes messages,
lets clients acknowledge some, rotates the log midway, and stops. The second restores from
the log alone and checks that every session came back with exactly its subscriptions and
undelivered messages, then delivers them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import random
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import persistlog

codec = persistlog.Codec()


@codec.register("broker.Message")
@dataclasses.dataclass(frozen=True)
class Message:
    id: uuid.UUID
    topic: str
    payload: bytes
    published: datetime.datetime


@codec.register("broker.Subscribed")
@dataclasses.dataclass(frozen=True)
class Subscribed:
    client: str
    topic: str


@codec.register("broker.Unsubscribed")
@dataclasses.dataclass(frozen=True)
class Unsubscribed:
    client: str
    topic: str


@codec.register("broker.Queued")
@dataclasses.dataclass(frozen=True)
class Queued:
    client: str
    message: Message


@codec.register("broker.Acked")
@dataclasses.dataclass(frozen=True)
class Acked:
    client: str
    message_id: uuid.UUID


@codec.register("broker.SessionEnded")
@dataclasses.dataclass(frozen=True)
class SessionEnded:
    client: str


@codec.register("broker.SessionState")
@dataclasses.dataclass(frozen=True)
class SessionState:
    """A whole session, as written by an enumeration."""

    client: str
    subscriptions: list[str]
    pending: list[Message]


@dataclasses.dataclass
class Session:
    subscriptions: set[str] = dataclasses.field(default_factory=set)
    # Undelivered (or unacknowledged) messages, oldest first, by id.
    pending: dict[uuid.UUID, Message] = dataclasses.field(default_factory=dict)


class Broker:
    """Sessions in memory, every change logged first.

    One lock guards the sessions; each change is logged and applied under it, and the
    enumeration takes it per session, so a session's snapshot never misses a logged event
    (the concurrency contract persistlog asks of enumerate_all).
    """

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.log: persistlog.Log | None = None

    # -- persistence --------------------------------------------------------------------

    def replay(self, event: Any) -> None:
        """Apply one logged event. Events of one log can arrive before the snapshot of
        their session (updates keep flowing during an enumeration): a snapshot replaces
        the session, and an event for an unknown session creates it."""
        if isinstance(event, SessionState):
            self.sessions[event.client] = Session(set(event.subscriptions), {m.id: m for m in event.pending})
        elif isinstance(event, SessionEnded):
            self.sessions.pop(event.client, None)
        elif isinstance(event, Subscribed):
            self.sessions.setdefault(event.client, Session()).subscriptions.add(event.topic)
        elif isinstance(event, Unsubscribed):
            self.sessions.setdefault(event.client, Session()).subscriptions.discard(event.topic)
        elif isinstance(event, Queued):
            self.sessions.setdefault(event.client, Session()).pending[event.message.id] = event.message
        elif isinstance(event, Acked):
            self.sessions.setdefault(event.client, Session()).pending.pop(event.message_id, None)
        else:
            raise TypeError(f"not a broker event: {event!r} (is the codec registered?)")

    def enumerate_all(self, emit: Callable[[Any], None]) -> None:
        with self.lock:
            clients = list(self.sessions)
        for client in clients:
            with self.lock:
                s = self.sessions.get(client)
                if s is not None:
                    emit(SessionState(client, sorted(s.subscriptions), list(s.pending.values())))

    def start(self, url: str, **options: Any) -> persistlog.RestoreResult:
        result = persistlog.restore(url, self.replay, codec=codec)
        # The lock keeps the concurrency contract, so enumerations run beside the updates.
        self.log = persistlog.open(url, self.enumerate_all, codec=codec, concurrent_enumeration=True, **options)
        return result

    def stop(self) -> None:
        if self.log is not None:
            self.log.close()

    def _record(self, events: list[Any]) -> None:
        assert self.log is not None
        # One call: the events of one operation reach the log together or not at all.
        self.log.update_many(events)
        for e in events:
            self.replay(e)

    # -- the broker's operations ----------------------------------------------------------

    def subscribe(self, client: str, topic: str) -> None:
        with self.lock:
            self._record([Subscribed(client, topic)])

    def unsubscribe(self, client: str, topic: str) -> None:
        with self.lock:
            self._record([Unsubscribed(client, topic)])

    def publish(self, topic: str, payload: bytes) -> int:
        """Queue a message for every subscribed session; returns how many got it."""
        message = Message(uuid.uuid4(), topic, payload, datetime.datetime.now(datetime.timezone.utc))
        with self.lock:
            events = [Queued(c, message) for c, s in self.sessions.items() if topic in s.subscriptions]
            if events:
                self._record(events)
        return len(events)

    def pending(self, client: str) -> list[Message]:
        with self.lock:
            s = self.sessions.get(client)
            return list(s.pending.values()) if s else []

    def ack(self, client: str, message_id: uuid.UUID) -> None:
        with self.lock:
            self._record([Acked(client, message_id)])

    def end_session(self, client: str) -> None:
        with self.lock:
            self._record([SessionEnded(client)])

    def snapshot(self) -> dict[str, tuple[list[str], list[uuid.UUID]]]:
        """Comparable state: each client's subscriptions and pending message ids."""
        with self.lock:
            return {c: (sorted(s.subscriptions), list(s.pending)) for c, s in self.sessions.items()}


def first_life(url: str, clients: int, messages: int, rng: random.Random) -> dict[str, Any]:
    broker = Broker()
    broker.start(url, durability="fsync", rotate_bytes=None)
    topics = [f"sensors/{i}" for i in range(8)]
    names = [f"client-{i:03d}" for i in range(clients)]
    for name in names:
        for topic in rng.sample(topics, 3):
            broker.subscribe(name, topic)
    for i in range(messages):
        broker.publish(rng.choice(topics), f"reading {i}".encode())
        if i % 7 == 0:  # some client catches up on part of its queue
            name = rng.choice(names)
            for m in broker.pending(name)[: rng.randint(1, 4)]:
                broker.ack(name, m.id)
        if i == messages // 2:
            broker.log.rotate()  # type: ignore[union-attr]  # a complete log of SessionStates
    broker.unsubscribe(names[0], sorted(broker.sessions[names[0]].subscriptions)[0])
    broker.end_session(names[-1])  # a clean disconnect: the session is gone
    expected = broker.snapshot()
    broker.stop()
    return expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="where the sessions live (a directory, s3://...)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)

    if persistlog.restore(args.url, lambda e: None, codec=codec).found:
        print(f"{args.url} already holds sessions; use an empty directory", file=sys.stderr)
        return 2
    expected = first_life(args.url, args.clients, args.messages, rng)
    undelivered = sum(len(p) for _, p in expected.values())
    print(f"first life: {len(expected)} sessions, {undelivered} undelivered messages; broker stopped")

    broker = Broker()
    result = broker.start(args.url, durability="fsync")
    got = broker.snapshot()
    print(f"second life: restored {result.records} events from log(s) {result.logs}")
    if got != expected:
        lost = {c for c in expected if got.get(c) != expected[c]}
        print(f"MISMATCH in sessions {sorted(lost)[:5]}", file=sys.stderr)
        broker.stop()
        return 1
    print(f"every session came back: {len(got)} sessions, subscriptions and {undelivered} undelivered messages")
    delivered = 0
    for client in list(got):
        for m in broker.pending(client):
            broker.ack(client, m.id)  # deliver, then acknowledge
            delivered += 1
    broker.stop()
    print(f"delivered {delivered} messages after the restart; queues are empty")
    return 0


if __name__ == "__main__":
    sys.exit(main())
