"""OpenAPI links: how the answer of a create feeds the operations on what it created, so a stateful client
(Schemathesis' state machine, a code generator) can chain create → read → act → delete.

Derived from the routes' shapes, once, when the document is built: a `POST /v1/things` whose 201 answer
has an `id` links to every operation on `/v1/things/{ref}` and below, with `ref` = `$response.body#/id`
(every `{ref}` route takes a name or an id)."""

from __future__ import annotations

from typing import Any

ITEM_PARAM = "ref"


def add_links(schema: dict[str, Any]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = schema.get("paths", {})
    for collection, item in paths.items():
        create = item.get("post")
        created = (create or {}).get("responses", {}).get("201")
        if not created:
            continue
        prefix = f"{collection}/{{{ITEM_PARAM}}}"
        links: dict[str, Any] = {}
        for path, ops in sorted(paths.items()):
            if path != prefix and not path.startswith(prefix + "/"):
                continue
            for method, op in sorted(ops.items()):
                target = op.get("operationId")
                if not target:
                    continue
                name = f"{method.upper()} {path[len(collection) :] or '/'}"
                links[name] = {
                    "operationId": target,
                    "parameters": {f"path.{ITEM_PARAM}": "$response.body#/id"},
                    "description": f"the created resource's id as `{ITEM_PARAM}`",
                }
        if links:
            created.setdefault("links", {}).update(links)
    return schema
