"""KREX on a JupyterHub node: ``krex hub-config`` (:mod:`krex_lab.hub.config`) writes a
``jupyterhub_config.py`` with KREX wired in, and :mod:`krex_lab.hub.admin_page` is the admins' page
(a JupyterHub service, OAuth, admin scope only). See ``docs/jupyterhub.md``."""
