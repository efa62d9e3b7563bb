//! Users, made and changed with the real useradd and usermod on this machine. Every test uses
//! names of its own and removes its accounts and groups at the end.

use std::process::Command;

use serde_json::json;

use crate::support::*;
use crate::systemd::unique;

/// Removes the test's accounts and groups even when the test failed.
struct Cleanup {
    users: Vec<String>,
    groups: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for u in &self.users {
            let _ = Command::new("userdel").arg("--remove").arg(u).output();
        }
        for g in &self.groups {
            let _ = Command::new("groupdel").arg(g).output();
        }
    }
}

fn getent(db: &str, key: &str) -> Option<Vec<String>> {
    let out = Command::new("getent").args([db, key]).output().unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().split(':').map(str::to_owned).collect())
}

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Account names are short: useradd refuses more than 32 characters.
fn name(prefix: &str) -> String {
    let mut n = unique(prefix);
    n.truncate(30);
    n
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_user_is_created_read_back_corrected_and_forgotten() {
    let s = Scratch::new();
    let user = name("mhu");
    let group = name("mhg");
    let extra = name("mhx");
    let _cleanup = Cleanup { users: vec![user.clone()], groups: vec![group.clone(), extra.clone()] };
    run(&["groupadd", &extra]);
    let home = s.p("home");

    let d = s.declare(json!([{"type": "user", "id": "app.user", "name": user, "uid": 23456, "group": group,
        "groups": [extra], "home": home, "shell": "/bin/sh"}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.user"), "created");
    let pw = getent("passwd", &user).expect("the account exists");
    assert_eq!(pw[2], "23456");
    assert_eq!(pw[5], home);
    assert_eq!(pw[6], "/bin/sh");
    let g = getent("group", &group).expect("the primary group was made");
    assert_eq!(pw[3], g[2]);
    assert!(getent("group", &extra).unwrap()[3].split(',').any(|m| m == user));
    assert!(s.path("home").is_dir(), "a user who is not a system user gets a home");

    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.user"), "unchanged");

    // Changed by hand: put back, and called a correction.
    run(&["usermod", "--shell", "/bin/bash", &user]);
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.user"), "corrected");
    assert_eq!(
        detail(&report, "app.user"),
        "changed on the machine since the host set it: shell /bin/bash to /bin/sh"
    );
    assert_eq!(getent("passwd", &user).unwrap()[6], "/bin/sh");

    // A new declaration is an update.
    let d2 = s.declare(json!([{"type": "user", "id": "app.user", "name": user, "uid": 23456, "group": group,
        "groups": [extra], "home": home, "shell": "/usr/sbin/nologin"}]));
    let (code, report) = s.apply(&d2);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.user"), "updated", "{report:#}");
    assert_eq!(getent("passwd", &user).unwrap()[6], "/usr/sbin/nologin");

    let (code, report) = s.apply(&s.declare(json!([])));
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "app.user"), "forgotten");
    assert!(detail(&report, "app.user").contains("may own files"));
    assert!(getent("passwd", &user).is_some(), "the account is left");
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_system_user_gets_no_home_and_no_login() {
    let s = Scratch::new();
    let user = name("mhs");
    let _cleanup = Cleanup { users: vec![user.clone()], groups: vec![] };
    let home = s.p("svc-home");
    let d =
        s.declare(json!([{"type": "user", "id": "svc.user", "name": user, "system": true, "home": home}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    let pw = getent("passwd", &user).unwrap();
    assert!(pw[2].parse::<u32>().unwrap() < 1000, "a system uid: {pw:?}");
    assert_eq!(pw[6], "/usr/sbin/nologin");
    assert!(!s.path("svc-home").exists());
}

#[test]
#[ignore = "needs the testbed: tests/run.sh sets it up"]
fn a_different_uid_or_a_missing_group_is_refused() {
    let s = Scratch::new();
    let user = name("mhd");
    let _cleanup = Cleanup { users: vec![user.clone()], groups: vec![] };
    run(&["useradd", "--uid", "23457", &user]);
    let d = s.declare(json!([{"type": "user", "id": "app.user", "name": user, "uid": 23458}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1, "{report:#}");
    let message = report["error"]["message"].as_str().unwrap();
    assert!(message.contains("has uid 23457 and the declaration says 23458"), "{message}");
    assert_eq!(getent("passwd", &user).unwrap()[2], "23457");

    let missing = name("mhnone");
    let d = s.declare(json!([{"type": "user", "id": "app.user", "name": user, "groups": [missing]}]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 1, "{report:#}");
    assert!(report["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&format!("the group {missing:?} named in groups does not exist")));
}
