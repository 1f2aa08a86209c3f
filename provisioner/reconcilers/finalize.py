"""Reconciler: a node that stays in `provisioning` without a finalize report errors with a clear reason.

The minion finalizes its own node (docs/join-protocol.md, "Finalize"; provisioner/services/fleet/finalize.py
takes its reports), so there is nothing to run here. What only the control plane can notice is a minion
that never reports: one too old to finalize, one whose play hangs, one that lost its network after the
join. Each pass errors every node in provisioning whose last report (or, before any, its entry into
provisioning) is older than the settings' `finalize_timeout_s` (RIGBASE_FINALIZE_TIMEOUT_S, 30 min).
Idempotent and stateless: a restarted control plane computes the same deadlines from the store."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from provisioner.domain.states import NodeState
from provisioner.reconcilers.loop import register
from provisioner.services.common.runtime import runtime_of
from provisioner.services.common.wakeups import Wake
from provisioner.services.fleet import finalize
from provisioner.store.engine import session_scope
from provisioner.store.models import Node

log = logging.getLogger("rigbase.reconcilers.finalize")
ACTOR = "reconciler:finalize"


@register(Wake.FINALIZE, period_s=30.0)
def reconcile(sessions: sessionmaker[Session]) -> None:
    timeout_s = runtime_of(sessions).settings.finalize_timeout_s
    with session_scope(sessions) as session:
        ids = list(session.scalars(select(Node.id).where(Node.state == NodeState.PROVISIONING)))
    for node_id in ids:
        try:
            with session_scope(sessions) as session:
                node = session.get(Node, node_id)
                if node is not None:
                    finalize.time_out(session, node, timeout_s=timeout_s, now=datetime.now(UTC), actor=ACTOR)
        except Exception:
            log.exception("finalize timeout check of node %s failed; retrying next pass", node_id)
