"""The embedded site (``manage.py serve``) as a separate process, started as a user would."""

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from tests.workers import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedSite:
    def __init__(self, var_dir):
        self.var = var_dir
        self.env = {key: value for key, value in os.environ.items()
                    if key not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL",
                                   "AWAKEN_QUEUE", "DJANGO_SETTINGS_MODULE")}
        self.env.update(AWAKEN_VAR_DIR=str(var_dir), SECRET_KEY="embedded-test", DEBUG="0")
        self.manage("migrate", "--no-input")
        self.manage("collectstatic", "--no-input")  # as make run does
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = var_dir / "serve.log"
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(self.port)], cwd=ROOT,
            env=self.env, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        self.token = None
        self.admin_password = None

    def manage(self, *args) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              check=True, capture_output=True, text=True).stdout

    def log(self) -> str:
        return self.log_path.read_text()

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the site exited:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.base}/healthz", timeout=2) as response:
                return json.load(response)["workers"] >= 1
        except OSError:
            return False

    def ready(self) -> None:
        found = re.search(r"Created operator 'admin' with password: (\S+)", self.log())
        self.admin_password = found.group(1) if found else None
        self.token = self.manage("operator_token", "admin").strip()

    def add_user(self, username: str, password: str, role: str) -> None:
        self.manage("shell", "-c", (
            "from django.contrib.auth.models import User, Group; "
            f"u = User.objects.create_user({username!r}, password={password!r}); "
            f"u.groups.add(Group.objects.get_or_create(name={role!r})[0])"))

    def call(self, method, path, body=None, token=None):
        request = urllib.request.Request(
            f"{self.base}{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Token {token or self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
