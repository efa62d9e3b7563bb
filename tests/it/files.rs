//! Files, directories, access and archives against a real filesystem.

use serde_json::json;

use crate::support::*;

#[test]
fn create_then_reapply_is_unchanged() {
    let s = Scratch::new();
    let d = s.declare(json!([
        {"type": "directory", "id": "web.root", "path": s.p("srv/web"), "mode": "0750"},
        {"type": "file", "id": "web.index", "path": s.p("srv/web/index.html"), "content": "hello\n"},
    ]));
    let (code, report) = s.apply(&d);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(action(&report, "web.root"), "created");
    assert_eq!(action(&report, "web.index"), "created");
    assert_eq!(std::fs::read_to_string(s.path("srv/web/index.html")).unwrap(), "hello\n");
    assert_eq!(mode_of(&s.path("srv/web")), 0o750);
    assert_eq!(mode_of(&s.path("srv/web/index.html")), 0o644);

    let (code, report) = s.apply(&d);
    assert_eq!(code, 0);
    assert_eq!(action(&report, "web.root"), "unchanged");
    assert_eq!(action(&report, "web.index"), "unchanged");
}
