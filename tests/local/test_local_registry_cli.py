"""`txstream registry up/down/status` as a user runs them: a real Apicurio Registry speaking
Confluent's API (registered and read back with confluent-kafka's own client), started twice,
and a bare `down` that stops the default port's registry only."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from txstream.local.cluster import free_port_block, port_is_free

SCHEMA = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}


def _txstream(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "txstream.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private cache directory (registrations never meet a user's), sharing the downloaded app;
    every registry is stopped after."""
    from txstream.local.paths import cache_dir
    from txstream.local.registry import APICURIO_VERSION, apicurio_app

    apicurio_app()
    env = {**os.environ, "TXSTREAM_CACHE_DIR": str(tmp_path / "cache")}
    (tmp_path / "cache").mkdir()
    os.symlink(cache_dir() / f"apicurio-registry-{APICURIO_VERSION}",
               tmp_path / "cache" / f"apicurio-registry-{APICURIO_VERSION}")
    yield env
    _txstream(env, "registry", "down", "--all", timeout=120)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def test_up_serves_confluents_api_and_down_stops_it(cli_env: dict[str, str]) -> None:
    port = free_port_block(2, blocks=1)
    for _ in range(2):
        up = _txstream(cli_env, "registry", "up", "--port", str(port))
        assert up.returncode == 0, up.stderr
        url = up.stdout.strip()
        assert url == f"http://127.0.0.1:{port}/apis/ccompat/v7"
        registered = _post(f"{url}/subjects/orders-value/versions", {"schema": json.dumps(SCHEMA)})
        assert isinstance(registered["id"], int)
        with urllib.request.urlopen(f"{url}/schemas/ids/{registered['id']}", timeout=10) as reply:
            assert json.loads(json.loads(reply.read())["schema"])["name"] == "Order"
        with urllib.request.urlopen(f"{url}/config", timeout=10) as reply:
            assert json.loads(reply.read())["compatibilityLevel"] == "BACKWARD"
        required = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "sku", "type": "string"}]}
        with pytest.raises(urllib.error.HTTPError) as refused:   # a new field without a default
            _post(f"{url}/subjects/orders-value/versions", {"schema": json.dumps(required)})
        assert refused.value.code == 409
        status = _txstream(cli_env, "registry", "status")
        assert f"{url}  answering" in status.stdout, status.stdout
        again = _txstream(cli_env, "registry", "up", "--port", str(port))
        assert again.returncode != 0 and "already runs" in again.stderr, again.stderr
        down = _txstream(cli_env, "registry", "down", "--port", str(port))
        assert down.returncode == 0 and "Stopped" in down.stderr, down.stderr
        assert port_is_free(port, "127.0.0.1")
        assert "No local schema registry is running." in _txstream(cli_env, "registry", "status").stdout


def test_a_bare_down_stops_only_the_default_ports_registry(cli_env: dict[str, str]) -> None:
    port = free_port_block(2, blocks=1)
    assert _txstream(cli_env, "registry", "up", "--port", str(port)).returncode == 0
    down = _txstream(cli_env, "registry", "down")
    assert down.returncode != 0 and f"--port {port}" in down.stderr, down.stderr
    assert not port_is_free(port, "127.0.0.1"), "a bare down stopped another port's registry"


def test_the_session_registry_fixture_answers(schema_registry: str) -> None:
    with urllib.request.urlopen(f"{schema_registry}/subjects", timeout=10) as reply:
        assert reply.status == 200


def test_schemas_list_show_check_register(schema_registry: str, tmp_path: Path) -> None:
    """`txstream schemas` against the session's registry: register, list, show, and a compatible
    and an incompatible evolution under BACKWARD (exit codes, not the server's texts)."""
    import uuid

    subject = f"orders-{uuid.uuid4().hex[:6]}-value"
    v1, v2, bad = (tmp_path / n for n in ("v1.avsc", "v2.avsc", "bad.avsc"))
    v1.write_text(json.dumps(SCHEMA))
    v2.write_text(json.dumps({**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "note", "type": "string",
                                                                         "default": ""}]}))
    bad.write_text(json.dumps({**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "sku", "type": "string"}]}))
    env = dict(os.environ)
    registry = ["--schema-registry", schema_registry]
    first = _txstream(env, "schemas", "register", subject, str(v1), *registry)
    assert first.returncode == 0 and first.stdout.strip().isdigit(), first.stderr
    assert subject in _txstream(env, "schemas", "list", *registry).stdout.split()
    assert _txstream(env, "schemas", "list", subject, *registry).stdout.split() == ["1"]
    shown = _txstream(env, "schemas", "show", subject, *registry)
    assert shown.returncode == 0 and json.loads(shown.stdout)["name"] == "Order"
    assert f"id {first.stdout.strip()}" in shown.stderr
    assert _txstream(env, "schemas", "check", subject, str(v2), *registry).returncode == 0
    refused = _txstream(env, "schemas", "check", subject, str(bad), *registry)
    assert refused.returncode == 1 and "NOT compatible" in refused.stderr, refused.stderr
    assert _txstream(env, "schemas", "register", subject, str(bad), *registry).returncode != 0
    missing = _txstream(env, "schemas", "show", "no-such-subject", *registry)
    assert missing.returncode != 0 and "no-such-subject" in missing.stderr and "Traceback" not in missing.stderr
    unreachable = _txstream(env, "schemas", "list", "--schema-registry", "http://127.0.0.1:1", timeout=120)
    assert unreachable.returncode != 0 and "cannot be reached" in unreachable.stderr, unreachable.stderr
    assert len(unreachable.stderr.strip().splitlines()) == 1, unreachable.stderr
