"""``llm42 serve`` as a real process on 127.0.0.1, for the server tests (not part of llm42.testing)."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llm42.model import embedded_model_path

SRC = Path(__file__).resolve().parents[1] / "src"
# a minimal template, so the embedded model (which has none) can answer /v1/chat/completions
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def chat_checkpoint(directory: Path) -> Path:
    """The embedded stories260K model with a chat template in its tokenizer config."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in embedded_model_path().iterdir():
        shutil.copy(path, directory / path.name)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m llm42 serve ARGS`` on a free port; ``url`` once /health answers."""

    def __init__(self, *args: str, api_key: str | None = None, startup_timeout: float = 120.0):
        self.port = free_port()
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "llm42", "serve", "--port", str(self.port), "--threads", "1",
                   "--log-level", "warning", *args]
        if api_key is not None:
            command += ["--api-key", api_key]
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "OMP_NUM_THREADS": "1"}
        # the log goes to a file: a full pipe would block the server
        self._log = tempfile.TemporaryFile("w+")
        self.output = ""
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"llm42 serve exited with {self.process.returncode}:\n{self._read_log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("llm42 serve did not start")
            time.sleep(0.1)

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics, by name without the ``llm42_`` prefix."""
        text = httpx.get(f"{self.url}/metrics", timeout=10.0).text
        samples = {}
        for line in text.splitlines():
            if line.startswith("llm42_") and "{" not in line:
                name, value = line.split()
                samples[name.removeprefix("llm42_")] = float(value)
        return samples

    def wait_idle(self, timeout: float = 30.0) -> dict[str, float]:
        """Metrics once no request is left in the engine."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["requests_pending"] == 0 and m["requests_running"] == 0 and m["kv_used_blocks"] == 0:
                return m
            if time.monotonic() > deadline:
                return m
            time.sleep(0.05)

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful shutdown); the exit status, and the log in ``output``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.output = self._read_log()
        return self.process.returncode

    def _read_log(self) -> str:
        """The log so far. ``pread``: the server shares the file's offset, so a seek here would move its writes."""
        self._log.flush()
        fd = self._log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def log(self) -> str:
        """What the server has logged so far (it keeps running)."""
        return self._read_log()


@contextlib.contextmanager
def background_load(fire_one, *, num_threads: int, warmup_s: float = 0.5):
    """Threads calling ``fire_one(rng, client_index)`` in a loop until the block ends; yields a one-item list
    counting the calls that returned. Re-raises the first error any thread hit."""
    stop, errors, fired = threading.Event(), [], [0]

    def loop(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                fire_one(rng, seed)
                fired[0] += 1
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=loop, args=(seed,)) for seed in range(num_threads)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(warmup_s)
        yield fired
    finally:
        stop.set()
        for thread in threads:
            thread.join(300)
    if errors:
        raise errors[0]
