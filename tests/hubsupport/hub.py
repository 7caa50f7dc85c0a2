"""A real JupyterHub started the way docs/jupyterhub.md starts it: as root, by the venv's absolute
path (``/opt/krex/bin/jupyterhub -f …``), from a plain ``PATH`` without the venv, in the config's
directory, on the file exactly as ``krex hub-config`` generated it. JupyterHub's own defaults do the
rest: PAM authentication at the login form, the local process spawner, configurable-http-proxy, and
the two managed services of the file (the node arbiter and the admin page).

Only the ports go on the command line (free loopback ports, so that tests can run beside anything
on 8000/8001/8081), with longer spawn timeouts for a loaded machine: nothing is added to the file.
The test's REST calls use a token the admin made after logging in through the form (:meth:`Hub.login`).
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil

#: root's PATH on a Debian node, without the venv: what the docs' command line runs with
PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HubError(AssertionError):
    pass


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Browser:
    """What a browser keeps for one person: the hub's cookies (login, ``_xsrf``)."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url
        self.jar = http.cookiejar.CookieJar()
        cookies = urllib.request.HTTPCookieProcessor(self.jar)
        self._follow = urllib.request.build_opener(cookies)
        self._stay = urllib.request.build_opener(cookies, _NoRedirect())

    def open(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        follow: bool = True,
    ) -> tuple[int, str, str, dict[str, str]]:
        """(status, final URL, body, headers) of one request (redirects followed unless ``follow`` is off)."""
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        opener = self._follow if follow else self._stay
        try:
            with opener.open(req, timeout=120) as r:
                return r.status, r.url, r.read().decode(errors="replace"), dict(r.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.url, exc.read().decode(errors="replace"), dict(exc.headers)

    def cookie(self, name: str) -> str:
        return next((c.value or "" for c in self.jar if c.name == name), "")

    def login(self, user: str, password: str) -> str:
        """The login form, filled in and posted (``POST /hub/login``, its ``_xsrf`` field with it);
        returns where the hub sends the user next. Raises with the page when the hub refuses."""
        code, _, page, _ = self.open("GET", "/hub/login")
        if code != 200:
            raise HubError(f"GET /hub/login: {code}\n{page[:2000]}")
        found = re.search(r'name="_xsrf"\s+value="([^"]+)"', page)
        xsrf = found.group(1) if found else self.cookie("_xsrf")
        form = urllib.parse.urlencode({"username": user, "password": password, "_xsrf": xsrf}).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        code, _, page, head = self.open("POST", "/hub/login", form, headers, follow=False)
        if code != 302:
            error = re.search(r'class="login_error"[^>]*>([^<]*)<', page)
            why = error.group(1) if error else page[:2000]
            raise HubError(f"{user} could not log in through the form: {code} {why}")
        return str(head.get("Location", ""))

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """A hub REST call with this browser's login cookie (and its ``_xsrf``, as the hub's pages send it)."""
        headers = {"X-XSRFToken": self.cookie("_xsrf"), "Accept": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        code, _, text, _ = self.open(method, f"/hub/api{path}", data, headers)
        if code not in (200, 201):
            raise HubError(f"{method} /hub/api{path} with a login cookie: {code} {text[:1000]}")
        return json.loads(text)

    def token(self, user: str, expires_in: int = 900) -> str:
        """A token of the logged-in user, made as the hub's token page makes it."""
        reply = self.api("POST", f"/users/{user}/tokens", {"note": "krex hub test", "expires_in": expires_in})
        return str(reply["token"])


class Hub:
    """``<venv>/bin/jupyterhub -f <dir>/jupyterhub_config.py``, run as root in ``<dir>``."""

    def __init__(self, workdir: Path, venv: Path, config_file: Path) -> None:
        self.dir = workdir
        self.venv = venv
        self.config_file = config_file
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "jupyterhub.log"
        #: the admin's token, for the test's REST calls (:meth:`use_admin`)
        self.token = ""

    def command(self) -> list[str]:
        return [
            str(self.venv / "bin" / "jupyterhub"),
            "-f",
            str(self.config_file),
            "--JupyterHub.ip=127.0.0.1",
            f"--JupyterHub.port={self.port}",
            f"--JupyterHub.hub_port={free_port()}",
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}",
            "--Spawner.start_timeout=120",
            "--Spawner.http_timeout=120",
        ]

    def start(self, timeout: float = 90) -> None:
        env = {"PATH": PLAIN_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/root"}
        log = open(self.log, "wb")  # noqa: SIM115 - the hub's stdout for its life
        self.proc = subprocess.Popen(
            self.command(), cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            code, _ = self.request("GET", f"{self.url}/hub/api/", None)
            if code == 200:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise HubError(f"the hub did not start:\n{self.log_tail()}")
            time.sleep(0.3)

    def browser(self) -> Browser:
        return Browser(self.url)

    def use_admin(self, user: str, password: str) -> None:
        """Log the admin in through the form (without spawning a server) and keep a token of theirs."""
        b = self.browser()
        try:
            b.login(user, password)
            self.token = b.token(user, expires_in=3600)
        except HubError as exc:
            raise HubError(f"{exc}\n--- hub log ---\n{self.log_tail(30)}") from None

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
        token: str | None,
        body: Any = None,
        timeout: float = 60,
        form: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """``body`` goes as JSON, ``form`` as a form; JSON replies are decoded, others are text."""
        data = None if body is None else json.dumps(body).encode()
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if token:
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
        except OSError:
            return 0, None
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")
        return code, payload

    def api(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202, 204)) -> Any:
        """A hub REST call as the admin (``/hub/api`` + path)."""
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
        """SIGTERM the hub (it stops the servers, its services and the proxy), then kill whatever it left."""
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
        # Its managed services (the arbiter's supervisor undoing and ending its regions) finish by
        # themselves after the hub's SIGTERM: give them the time before anything is killed.
        _, kids = psutil.wait_procs([p for p in kids if p.is_running()], timeout=15)
        pid_file = self.dir / "jupyterhub-proxy.pid"
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            chp = psutil.Process(int(pid_file.read_text()))
            if "configurable-http-proxy" in " ".join(chp.cmdline()):
                kids.append(chp)
        for p in kids:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.send_signal(signal.SIGCONT)
                    p.kill()
        with contextlib.suppress(OSError):
            os.unlink(pid_file)


class NodeArbiter:
    """The node arbiter the hub started (its managed service ``krex-arbiter``), as root sees it."""

    def __init__(self, runtime: Path) -> None:
        self.runtime = runtime
        self.endpoint = f"ipc://{runtime / 'arbiter.sock'}"

    def status(self) -> dict[str, Any]:
        from krex_lab import client

        return client.status(self.endpoint)

    def wait_ready(self, hub: Hub, timeout: float = 60) -> None:
        from krex_lab import client
        from krex_lab.errors import ArbiterUnavailable

        deadline = time.monotonic() + timeout
        while True:
            try:
                client.hello(self.endpoint, timeout=0.5)
                return
            except ArbiterUnavailable:
                if time.monotonic() > deadline:
                    raise HubError(f"the hub's krex-arbiter service did not answer:\n{hub.log_tail()}") from None
                time.sleep(0.2)


def generate_config(venv: Path, out: Path, *args: str) -> str:
    """``<venv>/bin/krex hub-config … -o out`` from a plain PATH, as the docs run it; the file's text."""
    r = subprocess.run(
        [str(venv / "bin" / "krex"), "hub-config", *args, "-o", str(out)],
        env={"PATH": PLAIN_PATH, "LANG": "C.UTF-8", "HOME": "/root"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        raise HubError(f"krex hub-config failed ({r.returncode}): {r.stdout}{r.stderr}")
    return out.read_text()


def start_documented_hub(
    stack: contextlib.ExitStack, base: Path, venv: Path, admin: str, admin_password: str, *args: str
) -> tuple[Hub, NodeArbiter]:
    """Generate the config (``args``: the allow rule, quotas) for a node with one simulated GPU, start
    the hub on it as the docs do (stopped when ``stack`` closes), wait for its arbiter, and log the
    admin in."""
    runtime = base / "arbiter"  # as /run/krex: root's, 0755
    runtime.mkdir(mode=0o755, exist_ok=True)
    etc = base / "etc"  # as /etc/jupyterhub: the hub's state (sqlite, cookie secret) lands here too
    etc.mkdir(mode=0o700, exist_ok=True)
    config = etc / "jupyterhub_config.py"
    generate_config(
        venv,
        config,
        *args,
        "--admin",
        admin,
        "--runtime-dir",
        str(runtime),
        "--admin-port",
        str(free_port()),
        "--backend",
        "fake",
        "--fake-gpus",
        "1",
        # Regions keep only KREX sessions off their cores: the tests' machine is shared (the default,
        # affinity, moves every process of the node for the region's length).
        "--shield",
        "sessions",
    )
    hub = Hub(etc, venv, config)
    stack.callback(hub.stop)
    hub.start()
    arbiter = NodeArbiter(runtime)
    arbiter.wait_ready(hub)
    hub.use_admin(admin, admin_password)
    return hub, arbiter
