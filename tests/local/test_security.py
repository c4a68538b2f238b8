"""A TLS + SASL/SCRAM-SHA-512 listener with ACLs (`txstream kafka up --tls --scram-user --acls`),
and every command through it: produce, consume, offsets, verify, and an exactly-once run killed
with -9 and restarted under exactly the ACLs `txstream acls` grants, with no credential in
anything the run wrote or printed; without any one of those ACLs the run stops at start, naming
it (docs/security.md, issue 54).

Two users: `ops` may do anything (the commands' round), `orders-app` only what `txstream acls`
grants its app.
"""
from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.commands import exercise, txstream
from tests.support.kafka import committed_or_none, produce, read_all
from tests.support.running import App
from tests.support.secret_scan import files_holding, wrapped
from tests.support.waiting import wait_until
from txstream.kafka.config import load_properties
from txstream.local.cluster import free_port_block

OPS, OPS_PASSWORD = "ops", "ops-Pa55-" + uuid.uuid4().hex[:8]
USER, PASSWORD = "orders-app", "scram-Pa55-" + uuid.uuid4().hex[:8]
PRINCIPAL = f"User:{USER}"
OAUTH_SECRET = "oidc-Secr3t-" + uuid.uuid4().hex[:8]
WIDE = "tests.support.wide_processors:BucketTotals"
STATEFUL = "tests.support.state_processors:BucketRunningTotals"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A one-node cluster started by `txstream kafka up --tls --scram-user`, in a cache of its own."""
    root = tmp_path_factory.mktemp("secured")
    port = free_port_block(1, blocks=3)
    env = {"TXSTREAM_CACHE_DIR": str(root / "cache")}
    up = txstream("kafka", "up", "--port", str(port), "--data-dir", str(root / "data"), "--tls", "--acls",
                  "--scram-user", f"{OPS}:{OPS_PASSWORD}", "--scram-user", f"{USER}:{PASSWORD}", timeout=240, **env)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        line = next(line for line in up.stderr.splitlines() if line.startswith("Secured listener"))
        plain, config = up.stdout.strip(), line.rsplit("--command-config ", 1)[1].strip()
        _grant_everything(plain, f"User:{OPS}")
        app_config = root / "app.properties"
        app_config.write_text(Path(config).read_text().replace(f"sasl.username={OPS}", f"sasl.username={USER}")
                              .replace(OPS_PASSWORD, PASSWORD))
        yield {"plain": plain, "secured": line.split(": ")[1].split(";")[0], "config": config,
               "app_config": str(app_config), "line": line, "env": env}
    finally:
        txstream("kafka", "down", "--port", str(port), timeout=120, **env)


def _grant_everything(plain: str, principal: str) -> None:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    admin = AdminClient({"bootstrap.servers": plain})
    bindings = [AclBinding(kind, "*", ResourcePatternType.LITERAL, principal, "*", AclOperation.ALL,
                           AclPermissionType.ALLOW)
                for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)]
    for future in admin.create_acls(bindings).values():
        future.result(30)


def _topics(plain: str, *names: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": plain})
    for future in admin.create_topics([NewTopic(n, partitions) for n in names]).values():
        future.result(30)


def test_kafka_up_writes_the_secured_listeners_client_settings(secured: dict) -> None:
    assert "(SASL_SSL)" in secured["line"]
    config = Path(secured["config"])
    assert config.stat().st_mode & 0o077 == 0, "the client settings hold a password: owner only"
    props = load_properties(config)
    assert props["security.protocol"] == "SASL_SSL" and props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert props["sasl.username"] == OPS and Path(props["ssl.ca.location"]).exists()


def test_commands_work_through_tls_and_scram(secured: dict) -> None:
    topic, output = f"tls-in-{uuid.uuid4().hex[:6]}", f"tls-out-{uuid.uuid4().hex[:6]}"
    _topics(secured["plain"], topic, output)
    exercise(secured["secured"], topic, output, ["--command-config", secured["config"]])


def test_a_client_certificate_is_accepted(secured: dict) -> None:
    ca = load_properties(secured["config"])["ssl.ca.location"]
    tls = Path(ca).parent
    topic = f"cert-{uuid.uuid4().hex[:6]}"
    _topics(secured["plain"], topic)
    proc = txstream("offsets", "show", "--app-id", "x", "--topic", topic, "--bootstrap-servers", secured["secured"],
                    "--command-config", secured["config"], "-X", f"ssl.keystore.location={tls / 'client.p12'}",
                    "-X", f"ssl.keystore.password={(tls / 'password').read_text().strip()}", "--timeout", "20")
    assert proc.returncode == 0 and topic in proc.stdout, proc.stderr


@pytest.mark.parametrize("wrong", [
    ("ssl.ca.location", "/etc/ssl/certs/ca-certificates.crt", "ssl.ca.location"),
    ("sasl.password", "not-the-password", "uthentication"),
], ids=["wrong-ca", "wrong-password"])
def test_a_wrong_setting_is_one_clear_line(secured: dict, wrong: tuple[str, str, str]) -> None:
    key, value, named = wrong
    proc = txstream("offsets", "show", "--app-id", "x", "--bootstrap-servers", secured["secured"],
                    "--command-config", secured["config"], "-X", f"{key}={value}", "--timeout", "5", timeout=90)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and named in lines[0], proc.stderr
    assert PASSWORD not in proc.stderr + proc.stdout


def test_exactly_once_through_tls_and_scram_under_kill_minus_nine(secured: dict, tmp_path: Path) -> None:
    source, sink = f"tls-run-in-{uuid.uuid4().hex[:6]}", f"tls-run-out-{uuid.uuid4().hex[:6]}"
    _topics(secured["plain"], source, sink, partitions=4)
    app_id = f"tls-app-{uuid.uuid4().hex[:6]}"
    acls = txstream("acls", "processors.passthrough:PassThrough", "--principal", PRINCIPAL, "--app-id", app_id,
                    "--input", source, "--output", sink, "--protocol", "narrow", "--execute",
                    "--bootstrap-servers", secured["plain"])
    assert acls.returncode == 0, acls.stderr
    assert len(acls.stdout.splitlines()) == 5 and "created" in acls.stderr
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(4000))
    proc = txstream("produce", source, "--bootstrap-servers", secured["secured"], "--command-config",
                    secured["config"], stdin=lines)
    assert proc.returncode == 0, proc.stderr
    # Everything the runs write lands under `written`: Spark's event log, its local directories,
    # every process's temporary files, the runs' logs.
    written = tmp_path / "written"
    (written / "events").mkdir(parents=True)
    app = App(secured["secured"], source, sink, 4, app_id=app_id, cap=250, master="local[2]",
              log_dir=str(written / "logs"), extra=["--command-config", secured["app_config"], "--conf", "spark.eventLog.enabled=true",
                     "--conf", f"spark.eventLog.dir=file://{written}/events", "--conf",
                     f"spark.local.dir={written}/local"],
              env_extra={"TMPDIR": str(written)})
    os.makedirs(app.log_dir, exist_ok=True)
    try:
        run = app.start(until_caught_up=False)

        def some_committed() -> bool:
            offsets = committed_or_none(secured["plain"], app.app_id, source, 4)
            return offsets is not None and 0 < sum(v or 0 for v in offsets.values()) < 4000

        assert wait_until(some_committed, 240, "a first committed batch", run=run), run.tail()
        run.kill9()
        assert app.until_done(3, timeout=420)[-1] == 0
    finally:
        app.destroy_all()
    proc = txstream("verify", "--input", source, "--output", sink, "--one-to-one", "--bootstrap-servers",
                    secured["secured"], "--command-config", secured["config"], "--timeout", "30")
    assert proc.returncode == 0 and "CLEAN" in proc.stdout, proc.stdout + proc.stderr
    # (an operator's principal: status also reads the output's tail, which the app only writes)
    proc = txstream("status", "--app-id", app_id, "--output", sink, "--bootstrap-servers", secured["secured"],
                    "--command-config", secured["config"], "--timeout", "30")
    assert proc.returncode == 0 and source in proc.stdout, proc.stdout + proc.stderr
    keystore_password = (Path(load_properties(secured["config"])["ssl.ca.location"]).parent / "password").read_text()
    assert list((written / "events").iterdir()), "Spark wrote no event log"
    for secret in (PASSWORD, keystore_password.strip()):
        assert files_holding(written, secret) == {}
        assert wrapped(app.log_text().encode(), secret.encode()) is None


@pytest.mark.parametrize("left_out", range(5), ids=["input", "output", "group", "poison-group", "transactional-ids"])
def test_a_missing_acl_stops_the_run_at_start_naming_it(secured: dict, left_out: int) -> None:
    source, sink = f"acl-in-{uuid.uuid4().hex[:6]}", f"acl-out-{uuid.uuid4().hex[:6]}"
    _topics(secured["plain"], source, sink)
    produced = txstream("produce", source, "--bootstrap-servers", secured["plain"], stdin='{"n": 1}\n')
    assert produced.returncode == 0, produced.stderr
    app_id = f"acl-app-{uuid.uuid4().hex[:6]}"
    from txstream.kafka import acls

    needs = acls.app_needs(app_id, [source], sink, None, "exactly-once", "narrow")
    assert [n.resource for n in needs] == ["topic", "topic", "group", "group", "transactional-id"]
    acls.grant(AdminClient({"bootstrap.servers": secured["plain"]}), needs[:left_out] + needs[left_out + 1:],
               PRINCIPAL, 30)
    proc = txstream("run", "processors.passthrough:PassThrough", "--app-id", app_id, "--input", source,
                    "--output", sink, "--bootstrap-servers", secured["secured"], "--command-config",
                    secured["app_config"], "--until-caught-up", timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: The app's principal lacks 1 ACL(s)") and needs[left_out].describe() in last, \
        proc.stderr[-3000:]
    assert "Spark" not in proc.stderr, "stopped before Spark started"
    assert committed_or_none(secured["plain"], app_id, source, 2) in ({0: None, 1: None}, None)
    out = txstream("consume", sink, "--bootstrap-servers", secured["plain"], "--timeout", "5")
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


def _keyed_input(plain: str, records: int) -> tuple[str, str]:
    source, sink = f"acl-in-{uuid.uuid4().hex[:6]}", f"acl-out-{uuid.uuid4().hex[:6]}"
    _topics(plain, source, sink)
    produce(plain, source, ((f"k{n}".encode(), b"x") for n in range(records)))
    return source, sink


def test_a_stateful_app_runs_under_exactly_its_acls(secured: dict) -> None:
    source, sink = _keyed_input(secured["plain"], 200)
    app_id = f"acl-state-{uuid.uuid4().hex[:6]}"
    acls = txstream("acls", STATEFUL, "--principal", PRINCIPAL, "--app-id", app_id, "--input", source,
                    "--output", sink, "--protocol", "stateful", "--execute", "--bootstrap-servers", secured["plain"])
    assert acls.returncode == 0, acls.stderr
    proc = txstream("run", STATEFUL, "--app-id", app_id, "--input", source, "--output", sink, "--master", "local[1]",
                    "--bootstrap-servers", secured["secured"], "--command-config", secured["app_config"],
                    "--until-caught-up", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    totals = {r.key: json.loads(r.value) for r in read_all(secured["plain"], sink)}
    assert sum(t["count"] for t in totals.values()) == 200


@pytest.mark.parametrize("left_out", ["topics", "groups"])
def test_without_an_internal_acl_a_wide_app_stops_at_start(secured: dict, left_out: str) -> None:
    from txstream.kafka import acls

    source, sink = _keyed_input(secured["plain"], 50)
    app_id = f"acl-wide-{uuid.uuid4().hex[:6]}"
    needs = acls.app_needs(app_id, [source], sink, None, "exactly-once", "wide")
    missing = acls.internal_topics_need(app_id) if left_out == "topics" else acls.internal_groups_need(app_id)
    acls.grant(AdminClient({"bootstrap.servers": secured["plain"]}), [n for n in needs if n != missing], PRINCIPAL, 30)
    proc = txstream("run", WIDE, "--app-id", app_id, "--input", source, "--output", sink, "--master", "local[1]",
                    "--bootstrap-servers", secured["secured"], "--command-config", secured["app_config"],
                    "--until-caught-up", timeout=400)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: The app's principal lacks 1 ACL(s)") and missing.describe() in last, \
        proc.stderr[-3000:]
    assert read_all(secured["plain"], sink, timeout=10) == []


@pytest.fixture(scope="module")
def oauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A broker whose secured listener takes SASL/OAUTHBEARER tokens, validated against the JWKS of
    a token endpoint of the test's own (tests/support/oidc.py); clients get their tokens from it
    with librdkafka's OIDC client (client credentials)."""
    from tests.support.oidc import TokenEndpoint
    from txstream.local.cluster import LocalKafkaCluster

    endpoint = TokenEndpoint({USER: OAUTH_SECRET})
    cluster = LocalKafkaCluster(port=free_port_block(1, blocks=3), data_dir=str(tmp_path_factory.mktemp("oauth")),
                                die_with_parent=True, oauth_jwks_url=endpoint.jwks_url)
    config = tmp_path_factory.mktemp("oauth-client") / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": USER, "sasl.oauthbearer.client.secret": OAUTH_SECRET,
        "sasl.oauthbearer.token.endpoint.url": endpoint.token_url}.items()))
    try:
        cluster.start()
        yield {"plain": cluster.bootstrap_servers, "secured": cluster.secured_bootstrap_servers,
               "config": str(config), "endpoint": endpoint}
    finally:
        cluster.stop()
        endpoint.close()


def test_commands_and_an_exactly_once_run_through_oauthbearer(oauth: dict, tmp_path: Path) -> None:
    topic, output = f"oidc-in-{uuid.uuid4().hex[:6]}", f"oidc-out-{uuid.uuid4().hex[:6]}"
    _topics(oauth["plain"], topic, output)
    exercise(oauth["secured"], topic, output, ["--command-config", oauth["config"]])
    source, sink = f"oidc-run-in-{uuid.uuid4().hex[:6]}", f"oidc-run-out-{uuid.uuid4().hex[:6]}"
    _topics(oauth["plain"], source, sink)
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(200))
    assert txstream("produce", source, "-b", oauth["secured"], "--command-config", oauth["config"],
                    stdin=lines).returncode == 0
    written = tmp_path / "written"
    (written / "events").mkdir(parents=True)
    proc = txstream("run", "processors.passthrough:PassThrough", "--input", source, "--output", sink,
                    "--app-id", f"oidc-{uuid.uuid4().hex[:6]}", "--master", "local[1]", "-b", oauth["secured"],
                    "--command-config", oauth["config"], "--conf", "spark.eventLog.enabled=true",
                    "--conf", f"spark.eventLog.dir=file://{written}/events", "--conf", f"spark.local.dir={written}/local",
                    "--until-caught-up", timeout=600, TMPDIR=str(written))
    assert proc.returncode == 0, proc.stderr[-3000:]
    verified = txstream("verify", "--input", source, "--output", sink, "--one-to-one", "-b", oauth["secured"],
                        "--command-config", oauth["config"], "--timeout", "30")
    assert verified.returncode == 0 and "CLEAN" in verified.stdout, verified.stdout + verified.stderr
    assert oauth["endpoint"].issued > 0
    assert files_holding(written, OAUTH_SECRET) == {}
    assert wrapped((proc.stdout + proc.stderr).encode(), OAUTH_SECRET.encode()) is None


def test_a_wrong_client_secret_is_one_clear_line(oauth: dict) -> None:
    proc = txstream("offsets", "show", "--app-id", "x", "-b", oauth["secured"], "--command-config", oauth["config"],
                    "-X", "sasl.oauthbearer.client.secret=wrong", "--timeout", "5", timeout=90)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "OAUTHBEARER token" in lines[0], proc.stderr
    assert "sasl.* settings" in lines[0] and OAUTH_SECRET not in proc.stderr
