"""The app of one worker process of `provision serve --workers N`: uvicorn imports this module in each
worker and calls `app_from_environment()`. The parent process has already migrated the store, made the
admin token and the TLS files, and put every setting into the environment (RIGBASE_*), so each worker
builds the same app from the same settings; the reconcilers run in exactly one of them (the leader,
provisioner/reconcilers/leader.py)."""

from __future__ import annotations

from fastapi import FastAPI

from provisioner.api.app import create_app
from provisioner.api.tuning import tune_process
from provisioner.settings import Settings


def app_from_environment() -> FastAPI:
    settings = Settings.load()
    app = create_app(settings, reconcilers=settings.reconcilers)
    tune_process()  # as the single-process server does
    return app
