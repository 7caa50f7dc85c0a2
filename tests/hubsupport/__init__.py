"""Helpers of ``tests/test_jupyterhub.py``: a real JupyterHub run as root, real Unix users, a venv
those users can run, and a kernel driven over the single-user server's websocket.

- :mod:`.venv`: a virtualenv of the system Python with ``krex-lab[jupyter]`` (editable, this
  checkout) and the test's own JupyterHub version, built once and cached by the hash of
  ``pyproject.toml`` and the checkout's path (a root-owned, world-readable directory).
- :mod:`.users`: ``useradd``-made users with a home of their own (removed with ``userdel``),
  and views of their processes (:func:`.users.processes_of`).
- :mod:`.hub`: :class:`.hub.Hub`, a ``jupyterhub`` process on free loopback ports with the dummy
  authenticator, the local process spawner and an admin service token for the test.
- :mod:`.kernel`: :class:`.kernel.KernelWS`, a kernel's ``/api/kernels/ID/channels`` websocket
  (the Jupyter message protocol written by hand), with arrival times of every output.
"""
