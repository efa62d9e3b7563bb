//! What every integration test needs: a scratch directory, a declaration writer, and the real
//! binary.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::Builder::new().prefix("mesh-host-it-").tempdir().expect("a scratch directory"),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A path inside the scratch directory, as a string for a declaration.
    pub fn p(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    pub fn state(&self) -> PathBuf {
        self.path("state/state.json")
    }

    /// Writes a declaration with these resources and returns its path.
    pub fn declare(&self, resources: Value) -> PathBuf {
        let path = self.path("declaration.json");
        let d = serde_json::json!({"version": 1, "resources": resources});
        std::fs::write(&path, serde_json::to_vec_pretty(&d).unwrap()).unwrap();
        path
    }

    /// Runs mesh-host with `--state` pointing into the scratch directory.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = assert_cmd::Command::cargo_bin("mesh-host").expect("the mesh-host binary");
        cmd.arg("--state").arg(self.state()).args(args);
        cmd.output().expect("mesh-host runs")
    }

    /// `apply --json`, returning the exit code and the report.
    pub fn apply(&self, declaration: &Path) -> (i32, Value) {
        let out = self.run(&["apply", "--json", declaration.to_str().unwrap()]);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "apply printed no JSON report ({e}); stdout: {}; stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report)
    }
}

/// The action reported for `id`.
pub fn action(report: &Value, id: &str) -> String {
    report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == id)
        .map(|o| o["action"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no outcome for {id} in {report:#}"))
}

/// The detail reported for `id`.
pub fn detail(report: &Value, id: &str) -> String {
    report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == id)
        .and_then(|o| o["detail"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}
