"""Secret rotation without a window of refused clients: the read API accepts each of the
comma-separated tokens of LENS_API_TOKEN, and `lens ingest` each token of a cluster's list; a
token of one cluster never passes for another (docs/OPERATIONS.md, "Rotating secrets")."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from lens_pipeline import bearer
from lens_pipeline.api.app import create_app
from lens_pipeline.ingest.config import Tokens, Unauthenticated
from lens_pipeline.store.db import get_engine
from lens_pipeline.store.migrate import ensure_schema


def test_the_api_accepts_the_old_and_the_new_token_during_a_rotation(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path / 'lens.db'}")
    ensure_schema(engine, "lens")
    client = TestClient(create_app(engine, token=" new-token , old-token "))
    status = {
        token: client.get(
            "/v1/nodes", params={"cluster": "c"}, headers={"authorization": f"Bearer {token}"}
        ).status_code
        for token in ("new-token", "old-token", "other", "new-token,old-token", "")
    }
    assert status["other"] == status["new-token,old-token"] == status[""] == 401
    assert status["new-token"] == status["old-token"] != 401


def test_ingest_accepts_each_token_of_a_clusters_list(tmp_path):
    (tmp_path / "east-next").write_text("east-next\n")
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  east: [east-old, {token_file: east-next}]\n  west: west-only\n")
    tokens = Tokens.load(str(path))
    assert tokens.cluster_of("Bearer east-old") == tokens.cluster_of("Bearer east-next") == "east"
    assert tokens.cluster_of("Bearer west-only") == "west"
    with pytest.raises(Unauthenticated):
        tokens.cluster_of("Bearer east-old,east-next")
    path.write_text("tokens:\n  east: [east-old, '']\n")
    with pytest.raises(ValueError, match="cluster east: empty token"):
        Tokens.load(str(path))


def test_one_bearer_check_serves_the_api_the_watch_cache_and_ingest():
    accepted = bearer.split_tokens(" new , ,old ")
    assert accepted == ["new", "old"]
    assert bearer.accepts("Bearer new", accepted) and bearer.accepts("bearer old ", accepted)
    for header in (
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic new",
        "Bearer ne",
        "Bearer new,old",
        "Bearernew",
        "Bearer  new",
        "Bearer new old",
    ):
        assert not bearer.accepts(header, accepted), header
    assert bearer.accepts(None, []), "no token configured: nothing is asked"
    assert bearer.matching("b", [("east", "a"), ("west", "b")]) == "west"
    assert bearer.matching("c", [("east", "a"), ("west", "b")]) is None
