"""The background thread that pushes a run's cumulative snapshots to the exporter.

Training never waits for it: the thread copies the run's state, POSTs it with a short
timeout and drops the failure if the exporter is down or slow. Because every snapshot
carries totals since the start of the run, the next successful push carries everything
the failed ones would have. Example::

    pusher = Pusher(run, "http://127.0.0.1:9445/api/v1/training", token=None, interval=5.0, timeout=2.0)
    pusher.start()
    ...
    pusher.stop()  # one final push marked finished
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import urllib.error
import urllib.request

from .run import Run

log = logging.getLogger("gpu_exporter.training")


class Pusher:
    """Push ``run.snapshot()`` to ``endpoint`` every ``interval`` seconds from a daemon thread."""

    def __init__(self, run: Run, endpoint: str, token: str | None, interval: float, timeout: float) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"training.start: push_interval ({interval}) and timeout ({timeout}) "
                             "must be > 0")
        self._run = run
        self._endpoint = endpoint
        self._headers = {"Content-Type": "application/json", "User-Agent": "gpu-exporter-training"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._interval = interval
        self._timeout = timeout
        # The exporter is node-local: never route pushes through an HTTP proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"gpu-exporter-push[{run.name}]", daemon=True)
        self._last_problem = ""
        self.pushes_ok = 0
        """Snapshots the exporter accepted (for tests and diagnostics)."""

    def start(self) -> None:
        """Start the daemon thread; the first push happens at once."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and send one last snapshot marked finished (waits at most about 2 x timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout + 1.0)
        self.push(finished=True)

    def _loop(self) -> None:
        self.push()
        while not self._stop.wait(self._interval):
            self.push()

    def push(self, finished: bool = False) -> bool:
        """Send one snapshot now; True when the exporter accepted it. Never raises."""
        if os.getpid() != self._run._pid:  # a forked copy: only the parent reports
            return False
        try:
            body = json.dumps(self._run.snapshot(finished=finished)).encode()
            request = urllib.request.Request(self._endpoint, data=body, headers=self._headers, method="POST")
            with self._opener.open(request, timeout=self._timeout) as response:
                response.read()
        except urllib.error.HTTPError as err:
            reason = err.read(200).decode(errors="replace").strip() or err.reason
            self._report(f"exporter at {self._endpoint} rejected the snapshot: HTTP {err.code} {reason}")
            return False
        except (OSError, http.client.HTTPException, ValueError) as err:
            self._report(f"cannot reach the exporter at {self._endpoint} ({err}); "
                         "will retry, nothing is lost")
            return False
        if self._last_problem:
            log.info("pushing to %s works again", self._endpoint)
            self._last_problem = ""
        self.pushes_ok += 1
        return True

    def _report(self, problem: str) -> None:
        """Log a push problem once, not on every retry."""
        if problem != self._last_problem:
            log.warning("%s", problem)
            self._last_problem = problem
