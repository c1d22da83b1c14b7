"""Continuous batching: one background thread drives the decoder's `DecodeSession`.

Contract:
- `Scheduler(decoder, metrics, max_batch, max_queue, retry_after_s)`; `start()` starts the thread,
  `stop(timeout)` ends it and fails whatever is left (503). The session is touched only by that
  thread; other threads talk to it through `submit` and `cancel`, under one lock.
- `submit(job)` queues a job, or raises `ApiError` 429 (with Retry-After) when `max_queue` jobs
  already wait beyond the free rows of the batch, or 503 while stopping.
- Between cycles the thread drops cancelled jobs (`cancel(job)`: a client that went away frees its
  row at the next boundary), admits waiting jobs while fewer than `max_batch` rows run (the
  engine merges their prefill into the ragged batch), then runs one cycle and sends each job its
  text (`jobs.Progress`), and at the end `jobs.Finished` or `jobs.Failed`, through `job.sink`.
  Stop strings are found in the text as tokens arrive; the row is then cancelled.
- A failing request never takes the batch down: if a cycle raises, the session is discarded and a
  fresh one is built; the jobs admitted in that cycle are the suspects (one alone: it fails with
  500; several: each is retried alone), and the other rows resume where they were (prompt plus
  committed tokens, same seed: greedy rows continue token for token). A cycle that fails with no
  new rows makes every row a suspect. A job restarted more than `MAX_RESTARTS` times fails.
- An error in one job's text handling fails that job only.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from dflash2.serve.jobs import Failed, Finished, Job, Piece, Progress
from dflash2.serve.metrics import ServerMetrics
from dflash2.serve.protocol import ApiError

log = logging.getLogger("dflash2.serve")

MAX_RESTARTS = 2


class Scheduler:
    def __init__(self, decoder, metrics: ServerMetrics, max_batch: int, max_queue: int, retry_after_s: int = 1):
        self.decoder, self.metrics = decoder, metrics
        self.max_batch, self.max_queue, self.retry_after_s = max_batch, max_queue, retry_after_s
        self._cond = threading.Condition()
        self._waiting: collections.deque[Job] = collections.deque()
        self._cancels: list[Job] = []
        self._running: dict[int, Job] = {}            # session key -> job (scheduler thread only)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.cycles = 0              # cycles run, and the most rows one of them decoded
        self.peak_running = 0
        metrics.watch(lambda: self.queue_depth, lambda: self.running)

    # ------------------------------------------------------------------ other threads
    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="dflash2-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        left = list(self._waiting) + list(self._running.values())
        self._waiting.clear()
        self._running.clear()
        for job in left:
            self._fail(job, ApiError(503, "The server shut down before this request finished.", code="shutting_down"))

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping or self._thread is None or not self._thread.is_alive():
                raise ApiError(503, "The server is shutting down.", code="shutting_down")
            free_rows = max(0, self.max_batch - len(self._running))
            if len(self._waiting) >= self.max_queue + free_rows:
                raise ApiError(429, f"The server is busy: {len(self._waiting)} requests are waiting (--max-queue "
                               f"{self.max_queue}). Retry after {self.retry_after_s} s.", code="queue_full",
                               headers={"Retry-After": str(self.retry_after_s)})
            self._waiting.append(job)
            self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        with self._cond:
            if job.done:
                return
            if job in self._waiting:
                self._waiting.remove(job)
                job.done = True
                self.metrics.ended("cancelled")
                return
            self._cancels.append(job)
            self._cond.notify_all()

    # ------------------------------------------------------------------ the scheduler thread
    def _loop(self) -> None:
        session = self.decoder.session()
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._cancels or self._running):
                    self._cond.wait()
                if self._stopping:
                    return
                cancels, self._cancels = self._cancels, []
                admitted = self._take_admissions()
            try:
                for job in cancels:
                    self._drop(session, job)
                new_keys = {key for key in (self._admit(session, job) for job in admitted) if key is not None}
                if not session:
                    continue
                try:
                    events = session.step()
                except Exception as err:  # noqa: BLE001 - whatever broke, the other rows go on
                    log.exception("decoding step failed; rebuilding the batch")
                    session = self._recover(session, err, new_keys)
                    continue
                self.cycles += 1
                self.peak_running = max(self.peak_running, len(self._running))
                for event in events:
                    self._dispatch(session, event)
            except Exception as err:  # noqa: BLE001 - a bug here must not stop serving
                log.exception("scheduler error; rebuilding the batch")
                session = self._recover(session, err, set())

    def _take_admissions(self) -> list[Job]:
        """Waiting jobs that fit in the batch; a suspect job is admitted alone."""
        taken: list[Job] = []
        while self._waiting and len(self._running) + len(taken) < self.max_batch:
            if self._waiting[0].done:
                self._waiting.popleft()
                continue
            if self._waiting[0].suspect and taken:
                break
            taken.append(self._waiting.popleft())
            if taken[-1].suspect:
                break
        return taken

    def _admit(self, session, job: Job) -> int | None:
        prompt, config = job.continuation() if job.output else (job.prompt, job.config)
        try:
            [key] = session.add([prompt], config)
        except Exception as err:  # noqa: BLE001 - checked at build time; anything here is this job's
            self._fail(job, ApiError(500, f"The request could not be admitted: {err}"))
            return None
        job.key, job.prefilling = key, True
        self._running[key] = job
        if job.restarts == 0:
            self.metrics.admitted(len(job.prompt))
        return key

    def _dispatch(self, session, event) -> None:
        job = self._running.get(event.key)
        if job is None:
            return
        try:
            commit = event.commit
            first = job.first_token_at is None
            origins, step = job.record(commit.tokens, commit.accepted, commit.drafted, commit.source,
                                       tree=commit.tree_extra is not None)
            if step is not None:
                self.metrics.spec_step(step)
            pieces = []
            for token, origin in zip(commit.tokens, origins):
                text = job.stream.push(token)
                job.output.append(token)
                job.origins.append(origin)
                pieces.append(Piece(text, token, origin))
                if job.stream.stopped:
                    break
            self.metrics.committed(len(pieces))
            if first:
                self.metrics.first_token(job.first_token_at - job.created)
            if pieces:
                job.sink(Progress(tuple(pieces)))
            if job.stream.stopped:
                if event.result is None:
                    session.cancel(event.key)
                self._finish(job, "stop")
            elif event.result is not None:
                job.stream.finish()
                self._finish(job, event.result.finish_reason)
        except Exception as err:  # noqa: BLE001 - one job's failure is that job's alone
            log.exception("request %s failed", job.id)
            if event.result is None:
                session.cancel(event.key)
            self._fail(job, ApiError(500, f"The server failed on this request: {type(err).__name__}: {err}"))

    def _drop(self, session, job: Job) -> None:
        if job.key is not None and self._running.get(job.key) is job:
            session.cancel(job.key)
            del self._running[job.key]
        with self._cond:  # re-queued by a recovery meanwhile
            if job in self._waiting:
                self._waiting.remove(job)
        if not job.done:
            job.done = True
            self.metrics.ended("cancelled")

    def _finish(self, job: Job, reason: str) -> None:
        self._running.pop(job.key, None)
        job.done = True
        stats = job.stats(time.perf_counter())
        self.metrics.ended(reason, stats, job.speculative_tokens, job.speculative_cycles)
        job.sink(Finished(reason, job.stream.text, tuple(job.output), tuple(job.origins), len(job.prompt), stats,
                          tuple(job.steps), job.num_spec_tokens))

    def _fail(self, job: Job, error: ApiError) -> None:
        if job.key is not None and self._running.get(job.key) is job:
            del self._running[job.key]
        if job.done:
            return
        job.done = True
        self.metrics.ended("error")
        job.sink(Failed(error))

    def _recover(self, broken, err: Exception, new_keys: set[int]):
        """A fresh session after a failed step; see the module docstring for who is blamed."""
        jobs = list(self._running.values())
        self._running.clear()
        broken.discard()
        session = self.decoder.session()
        new = [job for job in jobs if job.key in new_keys]
        old = [job for job in jobs if job.key not in new_keys]
        if len(new) == 1:        # the one new row broke it
            self._fail(new[0], ApiError(500, f"The server failed on this request: {type(err).__name__}: {err}"))
            new = []
        elif new:                # one of the new rows: find out which, one at a time
            for job in new:
                job.suspect = True
        elif not new_keys:       # no new rows: any row could be the cause
            for job in old:
                job.suspect = True
        retry = []
        for job in new + old:
            job.restarts += 1
            job.key = None
            if job.restarts > MAX_RESTARTS:
                self._fail(job, ApiError(500, f"The batch failed repeatedly while decoding this request: {err}"))
            else:
                retry.append(job)
        with self._cond:
            self._waiting.extendleft(reversed(retry))
        return session
