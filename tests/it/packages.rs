//! Packages against a local apt repository of .deb files the test builds.
//!
//! The host's apt configuration is never touched: mesh-host runs with `APT_CONFIG` pointing at
//! a configuration of the test's own, whose only source is the test's repository and whose
//! lists and cache live in the scratch directory. What dpkg installs is real (a package of a
//! unique name holding one file), and the test purges it at the end.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::*;
use crate::systemd::unique;

struct Repo {
    apt_config: String,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Builds `package` (version 1.0, one file) into a repository and an apt configuration that
/// sees only it.
fn repository(s: &Scratch, package: &str) -> Repo {
    for tool in ["dpkg-deb", "apt-ftparchive"] {
        assert!(
            Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap().status.success(),
            "{tool} is missing; run tests/testbed/systemd.sh, which installs it"
        );
    }
    let build = s.path("build");
    std::fs::create_dir_all(build.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(build.join(format!("usr/share/{package}"))).unwrap();
    std::fs::write(build.join(format!("usr/share/{package}/marker")), "installed by a mesh-host test\n")
        .unwrap();
    std::fs::write(
        build.join("DEBIAN/control"),
        format!(
            "Package: {package}\nVersion: 1.0\nArchitecture: all\nMaintainer: mesh-host tests <tests@invalid>\nDescription: a package that mesh-host's tests install\n"
        ),
    )
    .unwrap();
    let repo = s.path("repo");
    std::fs::create_dir_all(&repo).unwrap();
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&build)
        .arg(repo.join(format!("{package}_1.0_all.deb"))));
    let packages =
        Command::new("apt-ftparchive").arg("packages").arg(".").current_dir(&repo).output().unwrap();
    assert!(packages.status.success());
    std::fs::write(repo.join("Packages"), packages.stdout).unwrap();

    let apt = s.path("apt");
    for d in ["sources.list.d", "lists/partial", "cache/archives/partial", "preferences.d"] {
        std::fs::create_dir_all(apt.join(d)).unwrap();
    }
    std::fs::write(apt.join("sources.list"), format!("deb [trusted=yes] file:{} ./\n", repo.display()))
        .unwrap();
    let conf = apt.join("apt.conf");
    std::fs::write(
        &conf,
        format!(
            "Dir::Etc::SourceList \"{a}/sources.list\";\nDir::Etc::SourceParts \"{a}/sources.list.d\";\nDir::Etc::Preferences \"{a}/preferences\";\nDir::Etc::PreferencesParts \"{a}/preferences.d\";\nDir::State::Lists \"{a}/lists\";\nDir::Cache \"{a}/cache\";\nAPT::Sandbox::User \"root\";\n",
            a = apt.display()
        ),
    )
    .unwrap();
    Repo { apt_config: conf.display().to_string() }
}

fn apply(s: &Scratch, repo: &Repo, d: &Path) -> (i32, Value) {
    let out = assert_cmd::Command::cargo_bin("mesh-host")
        .unwrap()
        .env("APT_CONFIG", &repo.apt_config)
        .arg("--state")
        .arg(s.state())
        .args(["apply", "--json", d.to_str().unwrap()])
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), report)
}

fn installed(package: &str) -> bool {
    let out = Command::new("dpkg-query").args(["-W", "-f=${db:Status-Abbrev}", package]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).starts_with("ii")
}

/// Purges the test's package even when the test failed.
struct Purge(String);

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", &self.0]).output();
    }
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_package_is_installed_from_apt_read_back_and_never_removed() {
    let s = Scratch::new();
    let package = unique("mh-it-pkg");
    let _purge = Purge(package.clone());
    let repo = repository(&s, &package);

    let d = s.declare(json!([{"type": "package", "id": "tools.pkg", "package": package}]));
    let (code, report) = apply(&s, &repo, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tools.pkg"), "created");
    assert_eq!(detail(&report, "tools.pkg"), "installed with apt");
    assert!(installed(&package));

    let (code, report) = apply(&s, &repo, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tools.pkg"), "unchanged");

    // Removed by hand after the host installed it: installed again, and said so.
    run(Command::new("dpkg").args(["--purge", &package]));
    let (code, report) = apply(&s, &repo, &d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tools.pkg"), "corrected");
    assert!(installed(&package));

    // No longer declared: forgotten, and still installed.
    let (code, report) = apply(&s, &repo, &s.declare(json!([])));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "tools.pkg"), "forgotten");
    assert!(installed(&package));
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_package_no_source_has_is_a_clear_error() {
    let s = Scratch::new();
    let package = unique("mh-it-pkg");
    let repo = repository(&s, &package);
    let missing = unique("mh-it-nosuch");
    let d = s.declare(json!([{"type": "package", "id": "tools.nosuch", "package": missing}]));
    let (code, report) = apply(&s, &repo, &d);
    assert_eq!(code, 1, "{report:#}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("installing {missing} with apt-get failed")), "{message}");
    assert!(message.contains("Unable to locate package"), "{message}");
    assert!(!installed(&missing));
}
