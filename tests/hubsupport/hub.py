"""A real ``jupyterhub`` as root: dummy authenticator, local process spawner, free loopback ports,
configurable-http-proxy, and an admin service token for the test's REST calls."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what the test's service token may do: users, their servers and tokens, services
ADMIN_SCOPES = [
    "admin:users",
    "admin:servers",
    "tokens",
    "access:servers",
    "list:users",
    "read:users",
    "list:services",
    "read:services",
]


class HubError(AssertionError):
    pass


class Hub:
    """``jupyterhub -f <dir>/jupyterhub_config.py``, run in ``workdir`` (root's, 0700).

    The file is ``base_config`` (what ``krex hub-config`` generated, as a deployment would use it)
    followed by the test's settings: ports, the dummy authenticator, the local process spawner
    running ``venv``'s ``jupyterhub-singleuser``, and a service token with admin scopes. Lists and
    dicts the base may have set (``Spawner.args``/``environment``, ``services``, ``load_roles``,
    ``admin_users``) are extended, never replaced.
    """

    def __init__(
        self,
        workdir: Path,
        venv: Path,
        users: list[str],
        admin: str,
        chp: str,
        environment: str,
        spawner_args: list[str] | None = None,
        base_config: str = "",
    ) -> None:
        self.dir = workdir
        self.venv = venv
        self.users = users
        self.admin = admin
        self.chp = chp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(32)
        #: Python source of ``c.Spawner.environment`` (values may be callables of the spawner)
        self.environment = environment
        self.spawner_args = spawner_args or []
        self.base_config = base_config
        self.config_file = workdir / "jupyterhub_config.py"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "jupyterhub.log"

    def config(self) -> str:
        d = self.dir
        role = {"name": "krex-test-admin", "scopes": ADMIN_SCOPES, "services": ["krex-test"]}
        return f"""{self.base_config}

# -- the test's settings (tests/hubsupport/hub.py) --
c = get_config()  # noqa


def _krex_test_get(section, key, default):
    return c[section][key] if key in c[section] else default


c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{self.chp!r}]
c.ConfigurableHTTPProxy.pid_file = {str(d / "proxy.pid")!r}
c.ConfigurableHTTPProxy.auth_token = {secrets.token_hex(32)!r}
c.JupyterHub.db_url = {"sqlite:///" + str(d / "hub.sqlite")!r}
c.JupyterHub.cookie_secret_file = {str(d / "cookie_secret")!r}
c.JupyterHub.pid_file = {str(d / "hub.pid")!r}
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {set(self.users)!r}
c.Authenticator.admin_users = set(_krex_test_get("Authenticator", "admin_users", set())) | {{{self.admin!r}}}
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{str(self.venv / "bin" / "jupyterhub-singleuser")!r}]
c.Spawner.args = list(_krex_test_get("Spawner", "args", [])) + {self.spawner_args!r}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment = {{**_krex_test_get("Spawner", "environment", {{}}), **{self.environment}}}
c.JupyterHub.services = list(_krex_test_get("JupyterHub", "services", [])) + [
    {{"name": "krex-test", "api_token": {self.token!r}}}
]
c.JupyterHub.load_roles = list(_krex_test_get("JupyterHub", "load_roles", [])) + [{role!r}]
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True
"""

    def start(self, timeout: float = 60) -> None:
        cfg = self.config_file
        cfg.write_text(self.config())
        env = {
            "PATH": f"{Path(sys.executable).parent}:{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": str(self.dir),
        }
        log = open(self.log, "wb")  # noqa: SIM115 - the hub's stdout for its life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(cfg)],
            cwd=self.dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api("GET", "/")
                return
            except (HubError, OSError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise HubError(f"the hub did not start:\n{self.log_tail()}") from None
                time.sleep(0.3)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- REST ----------------------------------------------------------------------------
    def request(
        self,
        method: str,
        url: str,
        token: str,
        body: Any = None,
        timeout: float = 60,
        form: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """``body`` goes as JSON, ``form`` as a form; JSON replies are decoded, others are text."""
        data = None if body is None else json.dumps(body).encode()
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"token {token}")
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        elif form is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                code = r.status
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            code = exc.code
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        return code, payload

    def api(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202, 204)) -> Any:
        """A hub REST call as the admin service (``/hub/api`` + path)."""
        code, payload = self.request(method, f"{self.url}/hub/api{path}", self.token, body)
        if code not in ok:
            raise HubError(f"{method} /hub/api{path}: {code} {payload}")
        return payload

    def user_api(self, user: str, token: str, method: str, path: str, body: Any = None) -> Any:
        """A single-user server's REST call through the proxy (``/user/NAME/api`` + path)."""
        code, payload = self.request(method, f"{self.url}/user/{user}/api{path}", token, body)
        if code not in (200, 201, 202, 204):
            raise HubError(f"{method} /user/{user}/api{path}: {code} {payload}")
        return payload

    def ws_url(self, user: str, kernel_id: str) -> str:
        return f"ws://127.0.0.1:{self.port}/user/{user}/api/kernels/{kernel_id}/channels"

    # -- servers -------------------------------------------------------------------------
    def spawn(self, user: str) -> None:
        self.api("POST", f"/users/{user}/server", {})

    def wait_ready(self, user: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            model = self.api("GET", f"/users/{user}")
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                return dict(server)
            if time.monotonic() > deadline:
                raise HubError(f"{user}'s server was not ready within {timeout} s: {model}\n{self.log_tail()}")
            time.sleep(0.5)

    def user_token(self, user: str) -> str:
        reply = self.api("POST", f"/users/{user}/tokens", {"note": "krex hub test", "expires_in": 900})
        return str(reply["token"])

    def stop_server(self, user: str, timeout: float = 60) -> None:
        """``DELETE /hub/api/users/NAME/server`` and wait until the hub says it is gone."""
        self.api("DELETE", f"/users/{user}/server", ok=(202, 204, 400, 404))
        deadline = time.monotonic() + timeout
        while True:
            model = self.api("GET", f"/users/{user}")
            if not model.get("servers") and not model.get("pending"):
                return
            if time.monotonic() > deadline:
                raise HubError(f"{user}'s server did not stop within {timeout} s: {model}")
            time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM the hub (it stops the servers and the proxy), then kill whatever it left."""
        if self.proc is None:
            return
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            chp = psutil.Process(int((self.dir / "proxy.pid").read_text()))
            if "configurable-http-proxy" in " ".join(chp.cmdline()):
                kids.append(chp)
        for p in kids:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.send_signal(signal.SIGCONT)
                    p.kill()
        if os.path.exists(self.dir / "proxy.pid"):
            os.unlink(self.dir / "proxy.pid")
