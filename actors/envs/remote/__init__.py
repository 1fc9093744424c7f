"""Environments served over HTTP (../HTTP_ENV.md): the `http` client environment and a reference server."""
