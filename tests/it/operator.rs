//! The operator's side of the command line (issue 13): what `check` and `plan` read, what they
//! print under `--json`, and how they say a file's content would change.

use serde_json::{json, Value};

use crate::support::Scratch;

/// Runs mesh-host with `--state` in the scratch directory and `stdin` on its standard input.
fn run_with_stdin(s: &Scratch, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").expect("the mesh-host binary");
    cmd.arg("--state").arg(s.state()).args(args).write_stdin(stdin.to_vec());
    cmd.output().expect("mesh-host runs")
}

fn stdout_json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON on stdout ({e}); stdout: {}; stderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Writes `name` in the scratch directory `dir` with these resources.
fn document(s: &Scratch, dir: &str, name: &str, resources: Value) {
    std::fs::create_dir_all(s.path(dir)).unwrap();
    let d = json!({"version": 1, "resources": resources});
    std::fs::write(s.path(dir).join(name), serde_json::to_vec(&d).unwrap()).unwrap();
}

#[test]
fn check_and_plan_read_a_directory_as_run_does() {
    let s = Scratch::new();
    document(
        &s,
        "declaration.d",
        "10-dirs.json",
        json!([{"type": "directory", "id": "a.dir", "path": s.p("out")}]),
    );
    document(
        &s,
        "declaration.d",
        "20-files.json",
        json!([{"type": "file", "id": "a.conf", "path": s.p("out/a.conf"), "content": "a\n"}]),
    );
    // Not read: neither hidden nor anything but *.json.
    std::fs::write(s.path("declaration.d/.30-hidden.json"), "not json").unwrap();
    std::fs::write(s.path("declaration.d/README"), "not json").unwrap();
    let dir = s.p("declaration.d");

    let out = s.run(&["check", &dir]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("valid, 2 resources (1 directory, 1 file) in 1 modules"), "{text}");

    let summary = stdout_json(&s.run(&["check", "--json", &dir]));
    assert_eq!(summary["resources"], 2, "{summary:#}");
    assert_eq!(summary["types"], json!({"directory": 1, "file": 1}), "{summary:#}");
    assert_eq!(summary["modules"], json!(["a"]), "{summary:#}");

    let out = s.run(&["plan", "--json", &dir]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let plan = stdout_json(&out);
    assert_eq!(crate::support::action(&plan, "a.dir"), "created");
    assert_eq!(crate::support::action(&plan, "a.conf"), "created");
    assert_eq!(plan["error"], Value::Null);
    let diffs = plan["diffs"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{plan:#}");
    assert_eq!(diffs[0]["path"], s.p("out/a.conf"));
    assert!(diffs[0]["diff"].as_str().unwrap().contains("+a"), "{plan:#}");
    assert!(!s.path("out").exists(), "plan wrote nothing");
    assert!(!s.path("state").exists(), "not even the store");

    // A problem in a directory names the file it is in, as the daemon's refusal does.
    document(
        &s,
        "declaration.d",
        "30-bad.json",
        json!([{"type": "file", "id": "b.conf", "path": "relative"}]),
    );
    let out = s.run(&["check", &dir]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("30-bad.json: resources[0] (id \"b.conf\"), field `path`"), "{err}");
}

#[test]
fn check_plan_and_apply_read_standard_input() {
    let s = Scratch::new();
    let d = json!({"version": 1, "resources": [{"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "a\n"}]});
    let bytes = serde_json::to_vec(&d).unwrap();

    let out = run_with_stdin(&s, &["check", "-"], &bytes);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, "standard input: valid, 1 resources (1 file) in 1 modules\n");

    let plan = stdout_json(&run_with_stdin(&s, &["plan", "--json", "-"], &bytes));
    assert_eq!(crate::support::action(&plan, "a.conf"), "created");
    assert!(!s.path("a.conf").exists());

    let out = run_with_stdin(&s, &["apply", "-"], &bytes);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(s.path("a.conf")).unwrap(), "a\n");

    // Nothing on standard input is no declaration, refused as the usage it is.
    let out = run_with_stdin(&s, &["check", "-"], b"");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_refusal_under_json_is_json_on_stdout_and_exits_2() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "file", "id": "a.conf", "path": s.p("a.conf"), "content": "x"},
        {"type": "file", "id": "b.conf", "path": s.p("b.conf"), "content": "x", "mdoe": "0644"},
    ]));
    let d = d.to_str().unwrap();
    for command in ["check", "plan", "apply"] {
        let out = s.run(&[command, "--json", d]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let refusal = stdout_json(&out);
        let problems = refusal["refused"]["problems"].as_array().unwrap();
        assert_eq!(problems.len(), 1, "{command}: {refusal:#}");
        assert_eq!(problems[0]["index"], 1);
        assert_eq!(problems[0]["id"], "b.conf");
        assert_eq!(problems[0]["field"], "mdoe");
        assert!(problems[0]["message"].as_str().unwrap().contains("unknown field `mdoe`"), "{refusal:#}");
        assert_eq!(refusal["refused"]["unlisted"], 0);
        // The person at the terminal still reads it on stderr.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("resources[1] (id \"b.conf\"), field `mdoe`"), "{command}: {err}");
    }
    assert!(!s.path("a.conf").exists());
    assert!(!s.path("state").exists(), "nothing touched, not even the state directory");

    // A declaration file that is not there is bad usage (2), and JSON too under --json.
    let missing = s.p("missing.json");
    for command in ["check", "plan", "apply"] {
        let out = s.run(&[command, &missing]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        assert!(out.stdout.is_empty(), "{command}: nothing on stdout without --json");
        let out = s.run(&[command, "--json", &missing]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let refusal = stdout_json(&out);
        let message = refusal["refused"]["problems"][0]["message"].as_str().unwrap();
        assert!(message.contains("missing.json") && message.contains("No such file"), "{refusal:#}");
    }
    assert!(!s.path("state").exists());
}

#[test]
fn plan_says_binary_content_differs_by_size_instead_of_printing_it() {
    let s = Scratch::new();
    let found: Vec<u8> = (0u8..=255).cycle().take(1000).collect();
    std::fs::write(s.path("blob.bin"), &found).unwrap();
    let declared = [0u8, 1, 2, 0x1b, b'[', b'2', b'J'];
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(declared);
    let d = s.declare(json!([{"type": "file", "id": "a.blob", "path": s.p("blob.bin"), "bytes": b64}]));
    let out = s.run(&["plan", d.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("plan prints text, never the raw bytes");
    let expected = format!("{}: binary content differs (1000 bytes to 7 bytes)\n", s.p("blob.bin"));
    assert!(text.contains(&expected), "{text}");
    assert!(!text.contains('\u{1b}'), "no escape sequence reaches the terminal: {text:?}");
    assert_eq!(std::fs::read(s.path("blob.bin")).unwrap(), found, "plan wrote nothing");
}

/// promtool, from Debian's `prometheus` package; a test that needs it fails, saying how to get
/// it, where it is missing.
fn promtool() -> std::process::Command {
    let found = std::process::Command::new("promtool").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "promtool is missing: tests/testbed/60-prometheus.sh installs it (tests/run.sh and tests/testbed/up.sh run it)"
    );
    std::process::Command::new("promtool")
}

/// GETs /metrics from a daemon with this `Accept` header (none when `None`, as curl sends
/// `*/*`), returning the head and the body.
fn scrape(port: u16, accept: Option<&str>) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{accept}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.to_owned(), body.to_owned())
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn promtool_finds_the_live_metrics_clean() {
    let mut promtool = promtool();
    let s = Scratch::new();
    let d = s.declare(json!([{"type": "file", "id": "op.conf", "path": s.p("op.conf"), "content": "a\n"}]));
    let daemon = crate::support::Daemon::start(&s, &d, &["--resync", "900"]);

    // What `curl /metrics` gets: the classic text, which promtool reads without a complaint.
    let (head, body) = scrape(daemon.port, None);
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    let mut check = promtool
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(checked.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{body}");

    // Every labelled counter is there at 0 before anything happened to it: the first
    // correction after a start is then an increase() Prometheus can see.
    for series in [
        r#"mesh_host_drift_corrections_total{type="file"} 0"#,
        r#"mesh_host_drift_corrections_total{type="container"} 0"#,
        r#"mesh_host_resource_failures_total{type="service"} 0"#,
        r#"mesh_host_resource_outcomes_total{type="file",action="corrected"} 0"#,
        r#"mesh_host_scheduled_runs_total{result="failed"} 0"#,
        r#"mesh_host_queue_adds_total{source="docker"} 0"#,
        "mesh_host_resync_period_seconds 900.0",
    ] {
        assert!(body.lines().any(|l| l == series), "{series} is not exported:\n{body}");
    }
    // And it moves from there.
    std::fs::write(s.path("op.conf"), "by hand\n").unwrap();
    assert!(
        crate::support::wait_for(crate::support::PATIENCE, || {
            daemon.metric(r#"mesh_host_drift_corrections_total{type="file"}"#) == 1.0
        }),
        "the correction was not counted:\n{}",
        daemon.log()
    );

    // Prometheus asks for OpenMetrics first, and gets it.
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (head, body) = scrape(daemon.port, Some(prometheus));
    assert!(head.contains("Content-Type: application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(body.contains("# TYPE mesh_host_drift_corrections counter"), "{body}");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn the_alert_rules_pass_promtool_and_their_own_tests() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus");
    let checked =
        promtool().args(["check", "rules"]).arg(format!("{dir}/mesh-host.rules.yml")).output().unwrap();
    assert!(
        checked.status.success(),
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let tested =
        promtool().args(["test", "rules"]).arg(format!("{dir}/mesh-host.rules.test.yml")).output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&tested.stdout), String::from_utf8_lossy(&tested.stderr));
    assert!(tested.status.success() && said.contains("SUCCESS"), "promtool test rules: {said}");
}
