"""Real processes that stand in for uninstrumented GPU jobs, for tests/test_evidence*.py.

``cpu``: the main process decodes batches itself (a busy Python loop, no worker process);
``io``: the main process waits for storage (8 MiB O_DIRECT reads of a file, so the page cache
cannot serve them and the main thread sits in uninterruptible disk wait, state D);
``workers N``: the main process sleeps while N child processes are busy. Each runs ``seconds``::

    python tests/evidence_standins.py io 30 /tmp/data.bin
"""

from __future__ import annotations

import mmap
import os
import random
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 8 << 20
CHUNKS = 8


def busy(seconds: float) -> None:
    """Use one core until ``seconds`` have passed."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1


def make_data(path: Path) -> None:
    """A file of CHUNKS x 8 MiB for the io stand-in (written once)."""
    if not path.exists() or path.stat().st_size < CHUNK * CHUNKS:
        with path.open("wb") as f:
            for _ in range(CHUNKS):
                f.write(os.urandom(CHUNK))


def direct_io_works(path: Path) -> bool:
    """True when the file system under ``path`` takes O_DIRECT reads (tmpfs does not)."""
    make_data(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        os.preadv(fd, [mmap.mmap(-1, CHUNK)], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read_direct(path: Path, seconds: float) -> None:
    """Read ``path`` in 8 MiB O_DIRECT chunks at random offsets until ``seconds`` have passed."""
    make_data(path)
    buf = mmap.mmap(-1, CHUNK)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        os.preadv(fd, [buf], random.randrange(CHUNKS) * CHUNK)


def main(argv: list[str]) -> None:
    kind, seconds = argv[0], float(argv[1])
    if kind == "cpu":
        busy(seconds)
    elif kind == "io":
        read_direct(Path(argv[2]), seconds)
    elif kind == "workers":
        children = [subprocess.Popen([sys.executable, __file__, "cpu", str(seconds)]) for _ in range(int(argv[2]))]
        time.sleep(seconds)
        for child in children:
            child.wait()
    else:
        raise SystemExit(f"unknown stand-in {kind!r}: cpu, io or workers")


if __name__ == "__main__":
    main(sys.argv[1:])
