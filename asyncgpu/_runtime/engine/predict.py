"""Prediction: how long each (stream, tag)'s work takes once the stream is free and how much that varies, how
long a loop takes to act on a wake-up, and from these when to look at a head, arm a poller or wake a thread."""

from __future__ import annotations

import time
from typing import Any

from asyncgpu._runtime.engine.waiter import KIND_ASYNCIO, KIND_CALLBACK, KIND_THREAD, Waiter, _Queue

MIN_POLL_NS = 8_000
MAX_POLL_NS = 100_000  #: the longest the thread leaves a head unlooked at whose completion it cannot predict
#: with a prediction, the thread still looks on the way at least every max(this, the estimate / 32): an
#: estimate learned from slower work (a burst after a hold, a shorter run after a longer one) costs at most that
MIN_ON_THE_WAY_NS = 200_000
LEAD_MARGIN_NS = 10_000  #: a poller is armed (learned wake-up delay + this + twice the spread) before completion
INITIAL_DELIVERY_NS = {0: 30_000, 1: 60_000, 2: 20_000}  #: first guesses of the arm-to-first-poll delay (asyncio,
#: trio, a blocked thread)
MIN_WINDOW_NS = 60_000  #: a prediction is missed once it is late by max(this, twice the spread) for a loop's wait
#: (whose poller, or the task itself, polls until then: the loop's CPU), max(this, est/4) for a plain thread
SPIN_MARGIN_NS = 20_000  #: a callback's head is looked at from this (+ est/16) before its prediction on
#: a loop's poller queries a head whose completion the engine predicts only from (twice its spread + this) before
#: the prediction on, or once `MAX_POLL_NS` passed since its last look: every query costs the loop's own time, and
#: querying heads long before they are due slows the loop under load
DUE_MARGIN_NS = 20_000

_now = time.perf_counter_ns


class Prediction:
    """The engine's learning and planning (a part of `Engine`)."""

    _queues: dict[int, _Queue]  # stream key -> its pending waits and what was learned of it
    _delivery_ns: dict[int, int]  # kind -> the learned arm-to-first-poll delay

    def _due_ns(self, qs: _Queue, w: Waiter) -> int:
        """When the thread should first look at a new head ``w`` (0: at once). Under the lock."""
        est = qs.estimate_ns.get(w.tag)
        if est is None:
            return 0
        predicted = max(w.record_ns, qs.last_done_ns) + est
        if w.kind <= KIND_THREAD:
            return predicted - self._lead_ns(w.kind, qs, w.tag, est)
        return predicted - SPIN_MARGIN_NS - (est >> 4)

    def _lead_ns(self, kind: int, qs: _Queue, tag: Any, est: int) -> int:
        spread = qs.spread_ns.get(tag, est >> 5)
        return self._delivery_ns[kind] + LEAD_MARGIN_NS + min(2 * spread, est >> 3)

    def estimate_ns(self, key: int, tag: Any) -> int | None:
        qs = self._queues.get(key)
        return None if qs is None else qs.estimate_ns.get(tag)

    def delivery_ns(self, kind: int = KIND_ASYNCIO) -> int:
        """The learned delay from arming a loop's poller (or waking a thread) to its first poll, in ns."""
        return self._delivery_ns[kind]

    def _learn(self, qs: _Queue, w: Waiter, now: int) -> None:
        """``w``, the head of its stream, was seen complete at ``now``: a sample of how long its work takes."""
        last = qs.last_done_ns
        if now <= last:
            return
        qs.last_done_ns = now
        if w.kind == KIND_CALLBACK:
            return
        took = now - max(w.record_ns, last)
        tag = w.tag
        est = qs.estimate_ns.get(tag)
        if est is None:
            qs.estimate_ns[tag] = took
            return
        qs.estimate_ns[tag] = took if took < est else est + (took - est) // 8
        spread = qs.spread_ns.get(tag, est >> 5)
        qs.spread_ns[tag] = spread + (abs(took - est) - spread) // 8

    def _learn_delivery(self, kind: int, sample: int) -> None:
        """Track the arm-to-first-poll delay near its upper end: up by a quarter, down by a sixteenth of the
        difference, a sample counting at most twice the current estimate (one stall moves it little)."""
        if sample <= 0:
            return
        est = self._delivery_ns[kind]
        sample = min(sample, 2 * est)
        self._delivery_ns[kind] = est + ((sample - est) >> 2 if sample > est else -((est - sample) >> 4))

    def learn_delivery(self, kind: int, sent_ns: int) -> None:
        """A poller's arm message sent at ``sent_ns`` reached its loop now (called in that loop's thread)."""
        self._learn_delivery(kind, _now() - sent_ns)
