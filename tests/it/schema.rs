//! The schema agrees with the agent (issue 13, point 5): a corpus of declarations, valid and
//! invalid, goes through both `mesh-host check` and a real JSON Schema validator (Debian's
//! python3-jsonschema, draft 2020-12) over what `mesh-host schema` prints. Any disagreement
//! fails the test, but for the listed ones, each a rule JSON Schema cannot state.

use serde_json::{json, Value};

use crate::support::Scratch;

/// Why the schema cannot refuse what the agent refuses in these cases.
const CANNOT_SAY: &[(&str, &str)] = &[
    ("duplicate-ids", "uniqueness of one property across the items of an array"),
    ("duplicate-targets", "uniqueness of a derived value (the path) across items"),
    ("restart-on-undeclared", "a reference from one item to another's id"),
    ("reload-on-undeclared", "a reference from one item to another's id"),
    ("secret-hole-undeclared", "a name inside a string that must be a key of another property"),
    ("into-json-not-an-object", "JSON inside a string"),
    ("into-env-not-key-value", "the lines of a string"),
    ("into-secret-hole-in-a-key", "JSON inside a string"),
    ("duplicate-json-key", "a validator sees the parsed document, where the last key won"),
    ("version-as-float", "`const: 1` equals 1.0 in JSON Schema; the agent reads an integer"),
    ("uid-as-float", "`type: integer` takes 1.0; the agent reads an integer"),
    ("cron-range-backwards", "the order of two numbers in a string"),
    ("container-port-range-lengths", "that two ranges in a string are of the same length"),
    ("container-port-range-backwards", "the order of two numbers in a string"),
    ("container-port-range-too-long", "the length of a range in a string"),
    ("cidr-bad-ipv6", "the IPv6 grammar, which the schema gives loosely to stay readable"),
];

/// The corpus: a name, and a declaration. Whether the agent accepts it is the agent's to say;
/// the test compares, so it holds no verdicts the agent could drift from in silence. The names
/// say what each is meant to be, and the test also checks that the `valid-` ones are valid.
fn corpus() -> Vec<(&'static str, Value)> {
    let d = |resources: Value| json!({"version": 1, "resources": resources});
    let file = |extra: Value| {
        let mut f = json!({"type": "file", "id": "a.f", "path": "/etc/a"});
        f.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        d(json!([f]))
    };
    let container = |extra: Value| {
        let mut c = json!({"type": "container", "id": "a.c", "name": "web", "image": "local/web:1"});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        d(json!([c]))
    };
    let one = |r: Value| d(json!([r]));
    vec![
        // Valid.
        ("valid-empty", d(json!([]))),
        (
            "valid-spec-example",
            d(json!([
                {"type": "directory", "id": "web.root", "path": "/srv/web", "mode": "0755", "owner": "www-data:www-data"},
                {"type": "file", "id": "web.env", "path": "/etc/web/web.env", "content": "PORT=8080\n", "mode": "0640"},
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "env-file": ["/etc/web/web.env"], "ports": ["127.0.0.1:8080:8080"]},
                {"type": "file", "id": "proxy.conf", "path": "/etc/nginx/conf.d/web.conf", "content": "server {}\n"},
                {"type": "service", "id": "proxy.nginx", "unit": "nginx.service", "state": "running",
                 "boot": "enabled", "restart-on": ["proxy.conf"]}
            ])),
        ),
        ("valid-adoption-null", json!({"version": 1, "resources": [], "adoption": null})),
        ("valid-adoption-taken", json!({"version": 1, "resources": [], "adoption": {"taken": ["web"]}})),
        ("valid-adoption-empty", json!({"version": 1, "resources": [], "adoption": {}})),
        (
            "valid-directory-three-digit-mode",
            one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "mode": "750", "owner": "root"})),
        ),
        (
            "valid-directory-sticky-mode",
            one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "mode": "1777"})),
        ),
        ("valid-path-trailing-slash", one(json!({"type": "directory", "id": "a.d", "path": "/srv/a/"}))),
        ("valid-path-dot-file", one(json!({"type": "directory", "id": "a.d", "path": "/srv/.a/...b"}))),
        ("valid-file-bytes", file(json!({"bytes": "AAEC/w=="}))),
        ("valid-file-bytes-empty", file(json!({"bytes": ""}))),
        ("valid-file-null-content-with-bytes", file(json!({"content": null, "bytes": "aGk="}))),
        (
            "valid-file-create-once",
            file(json!({"content": "x", "create-once": true, "mode": "0600", "owner": "app:app"})),
        ),
        ("valid-file-into-json", file(json!({"content": "{\"a\": 1}", "into": "json"}))),
        ("valid-file-into-env", file(json!({"content": "A=1\n# note\n\nB=2\n", "into": "env"}))),
        ("valid-id-digit-first", one(json!({"type": "directory", "id": "0a.b_c-d", "path": "/srv/a"}))),
        (
            "valid-access-write",
            one(json!({"type": "access", "id": "a.m", "path": "/srv/media", "mode": "write"})),
        ),
        ("valid-package", one(json!({"type": "package", "id": "a.p", "package": "nginx"}))),
        (
            "valid-service-stopped",
            one(
                json!({"type": "service", "id": "a.s", "unit": "cron.timer", "state": "stopped", "boot": "disabled"}),
            ),
        ),
        (
            "valid-container-full",
            container(json!({
                "env": {"A": "1", "lower case": "2"}, "env-file": ["/etc/a.env"],
                "ports": ["80", "8080:80", "127.0.0.1:8080:80/tcp", "127.0.0.1::53/udp", "[::1]:8443:443", "0080:80/sctp"],
                "volumes": ["/srv/data:/data", "named:/data2:ro", "/:/host"],
                "network": "net", "args": ["--flag", ""], "hosts": ["db:10.0.0.2", "v6:fd00::1"],
            })),
        ),
        ("valid-container-run-once", container(json!({"run-once": true}))),
        (
            "valid-container-port-ranges",
            container(
                json!({"ports": ["8000-8010:8000-8010", "127.0.0.1:9000-9001:9100-9101/udp", "7000-7002", "[::1]:6000-6001:6000-6001"]}),
            ),
        ),
        ("valid-container-host-gateway", container(json!({"hosts": ["host.docker.internal:host-gateway"]}))),
        ("container-port-range-backwards", container(json!({"ports": ["8010-8000:80"]}))),
        ("valid-container-schedule", container(json!({"schedule": "*/5 0-6,22 1,15 * 1-5"}))),
        ("valid-container-schedule-nickname", container(json!({"schedule": "@Daily"}))),
        ("valid-container-schedule-names", container(json!({"schedule": "30 6 * jan,Jul mon-FRI"}))),
        ("container-cron-reboot", container(json!({"schedule": "@reboot"}))),
        ("container-cron-bad-name", container(json!({"schedule": "0 0 * * monday"}))),
        ("valid-container-schedule-sunday-seven", container(json!({"schedule": " 0 3 * 1/2 7 "}))),
        (
            "valid-container-schedule-null-and-run-once",
            container(json!({"schedule": null, "run-once": true})),
        ),
        ("valid-network", one(json!({"type": "network", "id": "a.n", "name": "backend"}))),
        (
            "valid-user",
            one(
                json!({"type": "user", "id": "a.u", "name": "app", "system": true, "uid": 990, "group": "app", "groups": ["adm"], "home": "/var/lib/app", "shell": "/usr/sbin/nologin"}),
            ),
        ),
        (
            "valid-archive-source",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar.gz", "digest": format!("sha256:{}", "a".repeat(64))}),
            ),
        ),
        (
            "valid-archive-source-unverified",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar", "unverified": true}),
            ),
        ),
        (
            "valid-archive-bytes-bare-digest",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "bytes": "aGk=", "digest": "0".repeat(64)}),
            ),
        ),
        (
            "valid-process",
            one(
                json!({"type": "process", "id": "a.w", "name": "worker", "command": ["/bin/sleep", "9"], "env": {"A": "b"}, "user": "nobody"}),
            ),
        ),
        (
            "valid-action-in",
            one(
                json!({"type": "action", "id": "a.x", "command": ["true"], "verify": ["test", "-e", "/x"], "in": "web"}),
            ),
        ),
        (
            "valid-opening",
            one(
                json!({"type": "opening", "id": "a.o", "port": 22, "protocol": "udp", "from": ["10.0.0.0/8", "192.168.1.1", "fd00::/8", "::1"]}),
            ),
        ),
        // Invalid: the document.
        ("version-2", json!({"version": 2, "resources": []})),
        ("version-missing", json!({"resources": []})),
        ("version-as-string", json!({"version": "1", "resources": []})),
        ("version-as-float", json!({"version": 1.0, "resources": []})),
        ("resources-missing", json!({"version": 1})),
        ("resources-not-a-list", json!({"version": 1, "resources": {}})),
        // Written by the test itself: the json! macro cannot repeat a key.
        ("duplicate-json-key", Value::Null),
        ("unknown-top-level-key", json!({"version": 1, "resources": [], "extra": true})),
        ("adoption-unknown-key", json!({"version": 1, "resources": [], "adoption": {"took": []}})),
        ("resource-not-an-object", d(json!(["a.f"]))),
        ("type-missing", one(json!({"id": "a.d", "path": "/srv/a"}))),
        ("type-unknown", one(json!({"type": "cronjob", "id": "a.d"}))),
        ("id-missing", one(json!({"type": "directory", "path": "/srv/a"}))),
        ("id-upper-case", one(json!({"type": "directory", "id": "A.d", "path": "/srv/a"}))),
        ("id-dot-first", one(json!({"type": "directory", "id": ".a", "path": "/srv/a"}))),
        ("unknown-field", file(json!({"content": "x", "mdoe": "0644"}))),
        (
            "duplicate-ids",
            d(
                json!([{"type": "directory", "id": "a.d", "path": "/srv/a"}, {"type": "directory", "id": "a.d", "path": "/srv/b"}]),
            ),
        ),
        (
            "duplicate-targets",
            d(
                json!([{"type": "directory", "id": "a.d", "path": "/srv/a"}, {"type": "directory", "id": "a.e", "path": "/srv/a"}]),
            ),
        ),
        // Invalid: paths and modes.
        ("path-relative", one(json!({"type": "directory", "id": "a.d", "path": "srv/a"}))),
        ("path-dot-dot", one(json!({"type": "directory", "id": "a.d", "path": "/srv/../etc"}))),
        ("path-dot", one(json!({"type": "directory", "id": "a.d", "path": "/srv/./a"}))),
        ("path-empty-segment", one(json!({"type": "directory", "id": "a.d", "path": "/srv//a"}))),
        ("path-ends-in-dot-dot", one(json!({"type": "directory", "id": "a.d", "path": "/srv/.."}))),
        ("mode-as-number", one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "mode": 644}))),
        ("mode-not-octal", one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "mode": "0688"}))),
        ("mode-too-short", one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "mode": "64"}))),
        (
            "owner-two-colons",
            one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "owner": "a:b:c"})),
        ),
        (
            "owner-leading-dash",
            one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "owner": "-a"})),
        ),
        (
            "owner-too-long",
            one(json!({"type": "directory", "id": "a.d", "path": "/srv/a", "owner": "a".repeat(33)})),
        ),
        // Invalid: files.
        ("file-no-content", file(json!({}))),
        ("file-content-and-bytes", file(json!({"content": "x", "bytes": "aGk="}))),
        ("file-content-and-sealed", file(json!({"content": "x", "sealed": "age..."}))),
        ("file-bytes-not-base64", file(json!({"bytes": "not base64!"}))),
        ("file-bytes-unpadded", file(json!({"bytes": "aGk"}))),
        ("file-bytes-trailing-bits", file(json!({"bytes": "aGl="}))),
        ("file-secrets-without-content", file(json!({"bytes": "aGk=", "secrets": {"db": "age..."}}))),
        ("secret-hole-undeclared", file(json!({"content": "pw=${secret:db}"}))),
        ("file-sealed-in-the-clear", file(json!({"sealed": "hunter2"}))),
        (
            "file-secret-in-the-clear",
            file(json!({"content": "pw=${secret:db}", "secrets": {"db": "hunter2"}})),
        ),
        ("file-sealed-base64-not-age", file(json!({"sealed": "aGk="}))),
        ("file-sealed-base64-wrapped", file(json!({"sealed": "YWdlLWVuY3J5cHRpb24ub3Jn\nL3YxCg=="}))),
        (
            "valid-file-sealed",
            file(
                json!({"content": "pw=${secret:db}", "secrets": {"db": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}}),
            ),
        ),
        (
            "valid-file-sealed-armored",
            file(
                json!({"sealed": "-----BEGIN AGE ENCRYPTED FILE-----\nYWdl\n-----END AGE ENCRYPTED FILE-----\n"}),
            ),
        ),
        ("into-without-content", file(json!({"bytes": "aGk=", "into": "env"}))),
        ("into-with-create-once", file(json!({"content": "A=1", "into": "env", "create-once": true}))),
        ("into-unknown", file(json!({"content": "A=1", "into": "yaml"}))),
        ("into-json-not-an-object", file(json!({"content": "[1]", "into": "json"}))),
        ("into-env-not-key-value", file(json!({"content": "just words", "into": "env"}))),
        (
            "valid-file-into-json-with-a-secret",
            file(json!({"content": "{\"password\": \"${secret:db}\"}", "into": "json",
                "secrets": {"db": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}})),
        ),
        (
            "into-secret-hole-in-a-key",
            file(json!({"content": "{\"${secret:db}\": 1}", "into": "json",
                "secrets": {"db": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}})),
        ),
        // Invalid: the other types.
        ("access-mode-rw", one(json!({"type": "access", "id": "a.m", "path": "/srv/media", "mode": "rw"}))),
        ("package-empty-name", one(json!({"type": "package", "id": "a.p", "package": ""}))),
        (
            "service-state-started",
            one(json!({"type": "service", "id": "a.s", "unit": "nginx.service", "state": "started"})),
        ),
        (
            "service-unit-without-suffix",
            one(json!({"type": "service", "id": "a.s", "unit": "nginx", "state": "running"})),
        ),
        (
            "service-boot-on",
            one(
                json!({"type": "service", "id": "a.s", "unit": "nginx.service", "state": "running", "boot": "on"}),
            ),
        ),
        (
            "restart-on-undeclared",
            one(
                json!({"type": "service", "id": "a.s", "unit": "nginx.service", "state": "running", "restart-on": ["a.nothing"]}),
            ),
        ),
        (
            "reload-on-undeclared",
            one(
                json!({"type": "service", "id": "a.s", "unit": "nginx.service", "state": "running", "reload-on": ["a.nothing"]}),
            ),
        ),
        ("container-run-once-and-schedule", container(json!({"run-once": true, "schedule": "0 * * * *"}))),
        ("container-name-with-space", container(json!({"name": "my web"}))),
        ("container-image-absolute", container(json!({"image": "/local/web"}))),
        ("container-port-word", container(json!({"ports": ["http"]}))),
        ("container-port-zero", container(json!({"ports": ["0:80"]}))),
        ("container-port-too-big", container(json!({"ports": ["65536:80"]}))),
        ("container-port-bad-protocol", container(json!({"ports": ["80/icmp"]}))),
        ("container-port-bad-ip", container(json!({"ports": ["300.0.0.1:80:80"]}))),
        ("container-port-range-lengths", container(json!({"ports": ["8000-8010:80-81"]}))),
        ("container-port-range-too-long", container(json!({"ports": ["1-65535"]}))),
        ("container-volume-relative-target", container(json!({"volumes": ["/srv/data:data"]}))),
        ("container-volume-dot-dot-source", container(json!({"volumes": ["/srv/../etc:/data"]}))),
        ("container-volume-no-target", container(json!({"volumes": ["/srv/data"]}))),
        ("container-host-no-ip", container(json!({"hosts": ["db"]}))),
        ("container-host-bad-ip", container(json!({"hosts": ["db:10.0.0.256"]}))),
        ("container-env-name-equals", container(json!({"env": {"A=B": "1"}}))),
        ("container-cron-four-fields", container(json!({"schedule": "0 * * *"}))),
        ("container-cron-minute-60", container(json!({"schedule": "60 * * * *"}))),
        ("container-cron-step-zero", container(json!({"schedule": "*/0 * * * *"}))),
        ("container-cron-weekday-8", container(json!({"schedule": "0 0 * * 8"}))),
        ("cron-range-backwards", container(json!({"schedule": "0 0 * * 5-1"}))),
        ("user-uid-negative", one(json!({"type": "user", "id": "a.u", "name": "app", "uid": -1}))),
        ("user-uid-too-big", one(json!({"type": "user", "id": "a.u", "name": "app", "uid": 4294967296u64}))),
        ("uid-as-float", one(json!({"type": "user", "id": "a.u", "name": "app", "uid": 1.0}))),
        ("user-shell-relative", one(json!({"type": "user", "id": "a.u", "name": "app", "shell": "bash"}))),
        (
            "archive-bytes-and-source",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "bytes": "aGk=", "source": "/tmp/a.tar"}),
            ),
        ),
        ("archive-neither", one(json!({"type": "archive", "id": "a.a", "path": "/srv/a"}))),
        (
            "archive-source-without-digest",
            one(json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar"})),
        ),
        (
            "archive-source-unverified-false",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar", "unverified": false}),
            ),
        ),
        (
            "archive-unverified-with-digest",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar", "digest": "0".repeat(64), "unverified": true}),
            ),
        ),
        (
            "archive-unverified-with-bytes",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "bytes": "aGk=", "unverified": true}),
            ),
        ),
        (
            "archive-digest-short",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar", "digest": "sha256:abc"}),
            ),
        ),
        (
            "archive-digest-upper-case",
            one(
                json!({"type": "archive", "id": "a.a", "path": "/srv/a", "source": "/tmp/a.tar", "digest": "A".repeat(64)}),
            ),
        ),
        ("process-empty-command", one(json!({"type": "process", "id": "a.w", "name": "w", "command": []}))),
        (
            "process-empty-program",
            one(json!({"type": "process", "id": "a.w", "name": "w", "command": ["", "x"]})),
        ),
        (
            "process-command-string",
            one(json!({"type": "process", "id": "a.w", "name": "w", "command": "sleep 9"})),
        ),
        ("action-verify-missing", one(json!({"type": "action", "id": "a.x", "command": ["true"]}))),
        ("opening-port-zero", one(json!({"type": "opening", "id": "a.o", "port": 0}))),
        ("opening-port-too-big", one(json!({"type": "opening", "id": "a.o", "port": 65536}))),
        ("opening-port-string", one(json!({"type": "opening", "id": "a.o", "port": "22"}))),
        (
            "opening-protocol-icmp",
            one(json!({"type": "opening", "id": "a.o", "port": 22, "protocol": "icmp"})),
        ),
        (
            "opening-cidr-prefix-33",
            one(json!({"type": "opening", "id": "a.o", "port": 22, "from": ["10.0.0.0/33"]})),
        ),
        ("opening-cidr-word", one(json!({"type": "opening", "id": "a.o", "port": 22, "from": ["anywhere"]}))),
        (
            "opening-cidr-leading-zero",
            one(json!({"type": "opening", "id": "a.o", "port": 22, "from": ["010.0.0.1"]})),
        ),
        ("cidr-bad-ipv6", one(json!({"type": "opening", "id": "a.o", "port": 22, "from": ["fd00:::1/8"]}))),
    ]
}

/// Validates each file against the schema with python3-jsonschema; one JSON line each.
const VALIDATOR: &str = r#"
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
for path in sys.argv[2:]:
    with open(path) as f:
        doc = json.load(f)
    errors = [e.message[:200] for e in validator.iter_errors(doc)]
    print(json.dumps({"path": path, "valid": not errors, "errors": errors[:3]}))
"#;

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_schema_accepts_and_refuses_what_the_agent_does() {
    let has_validator = std::process::Command::new("python3")
        .args(["-c", "import jsonschema; jsonschema.Draft202012Validator"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_validator,
        "python3-jsonschema is missing: tests/testbed/61-jsonschema.sh installs it (tests/run.sh and tests/testbed/up.sh run it)"
    );
    let s = Scratch::new();
    let schema = s.run(&["schema"]);
    assert!(schema.status.success());
    std::fs::write(s.path("schema.json"), &schema.stdout).unwrap();

    let corpus = corpus();
    assert!(corpus.len() >= 60, "the corpus has {} declarations", corpus.len());
    let mut names = std::collections::BTreeSet::new();
    let mut paths = Vec::new();
    for (name, declaration) in &corpus {
        assert!(names.insert(*name), "{name} is in the corpus twice");
        let path = s.path(&format!("{name}.json"));
        let text = if *name == "duplicate-json-key" {
            String::new()
        } else {
            serde_json::to_string(declaration).unwrap()
        };
        std::fs::write(&path, text).unwrap();
        paths.push(path);
    }
    // One the json! macro cannot write: the same key twice in an object.
    let duplicate = s.path("duplicate-json-key.json");
    std::fs::write(&duplicate, r#"{"version": 1, "resources": [{"type": "directory", "id": "a.d", "path": "/srv/a", "path": "/srv/b"}]}"#).unwrap();
    for listed in CANNOT_SAY {
        assert!(names.contains(listed.0), "{} is listed but not in the corpus", listed.0);
    }

    let validated = std::process::Command::new("python3")
        .args(["-c", VALIDATOR])
        .arg(s.path("schema.json"))
        .args(&paths)
        .output()
        .unwrap();
    assert!(
        validated.status.success(),
        "the validator failed: {}",
        String::from_utf8_lossy(&validated.stderr)
    );
    let verdicts: Vec<Value> = String::from_utf8(validated.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(verdicts.len(), paths.len());

    let mut disagreements = Vec::new();
    let mut listed_but_agreeing = Vec::new();
    for ((name, _), verdict) in corpus.iter().zip(&verdicts) {
        let path = s.path(&format!("{name}.json"));
        let out = s.run(&["check", path.to_str().unwrap()]);
        let agent = match out.status.code() {
            Some(0) => true,
            Some(2) => false,
            other => panic!("check of {name} ended {other:?}: {}", String::from_utf8_lossy(&out.stderr)),
        };
        if name.starts_with("valid-") {
            assert!(
                agent,
                "{name} is meant to be valid, and the agent refused it: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let schema = verdict["valid"].as_bool().unwrap();
        let listed = CANNOT_SAY.iter().any(|(n, _)| n == name);
        match (agent == schema, listed) {
            (true, false) | (false, true) => {}
            (true, true) => listed_but_agreeing.push(*name),
            (false, false) => disagreements.push(format!(
                "{name}: the agent {}, the schema {} {}\n    agent: {}",
                if agent { "accepts" } else { "refuses" },
                if schema { "accepts" } else { "refuses" },
                verdict["errors"],
                String::from_utf8_lossy(&out.stderr).lines().nth(1).unwrap_or("").trim(),
            )),
        }
        // A listed case is one the schema cannot refuse: the agent must be the one refusing.
        if listed && agent != schema {
            assert!(
                !agent && schema,
                "{name} is listed as beyond the schema, but agent={agent} schema={schema}"
            );
        }
    }
    assert!(disagreements.is_empty(), "the schema and the agent disagree:\n{}", disagreements.join("\n"));
    assert!(
        listed_but_agreeing.is_empty(),
        "listed as disagreements, but they agree: {listed_but_agreeing:?}"
    );
}
