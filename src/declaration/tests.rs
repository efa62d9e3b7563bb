//! How a declaration is refused, pinned as the text a person reads.
//!
//! Each case is a whole, small declaration and the full `Refused` display it earns. The text is
//! the product here: it is what an operator sees at 3 a.m. when a push to a fleet is refused, so
//! a change to it must be a deliberate one, reviewed in the snapshot diff
//! (`UPDATE_EXPECT=1 cargo test --lib declaration` rewrites the snapshots).

use expect_test::{expect, Expect};

use super::*;

/// Parses a declaration that must be refused, and returns what a person would be shown.
fn refused(json: &str) -> String {
    match Declaration::parse(json.as_bytes()) {
        Ok(d) => panic!(
            "accepted, with {} resources, a declaration that must be refused:\n{json}",
            d.resources.len()
        ),
        Err(refused) => refused.to_string(),
    }
}

fn check(json: &str, expected: Expect) {
    expected.assert_eq(&refused(json));
}

fn parsed(json: &str) -> Declaration {
    Declaration::parse(json.as_bytes()).unwrap_or_else(|refused| panic!("{refused}\n{json}"))
}

// The document as a whole.

#[test]
fn not_json() {
    check(
        r#"{"version": 1, "resources": [}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration: not JSON at line 1, column 30: expected value"#]],
    );
}

#[test]
fn not_an_object() {
    check(
        r#"[{"version": 1, "resources": []}]"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration: a declaration is a JSON object with `version` and `resources`"#]],
    );
}

#[test]
fn missing_version() {
    check(
        r#"{"resources": []}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `version`: missing; this build understands version 1"#]],
    );
}

#[test]
fn version_2() {
    check(
        r#"{"version": 2, "resources": []}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `version`: 2 is not a version this build understands (it understands [1])"#]],
    );
}

#[test]
fn version_as_a_string() {
    check(
        r#"{"version": "1", "resources": []}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `version`: "1" is not a version this build understands (it understands [1])"#]],
    );
}

#[test]
fn unknown_top_level_key() {
    check(
        r#"{"version": 1, "resources": [], "resource": []}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `resource`: unknown key; the declaration has `version`, `resources` and `adoption`"#]],
    );
}

#[test]
fn missing_resources() {
    check(
        r#"{"version": 1}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `resources`: missing; give a list, possibly empty"#]],
    );
}

#[test]
fn resources_misspelled() {
    check(
        r#"{"version": 1, "resource": []}"#,
        expect![[r#"
        the declaration was refused (2 problems); nothing on the machine was touched
          declaration, field `resources`: missing; give a list, possibly empty
          declaration, field `resource`: unknown key; the declaration has `version`, `resources` and `adoption`"#]],
    );
}

#[test]
fn resources_not_a_list() {
    check(
        r#"{"version": 1, "resources": {"type": "package", "id": "curl", "package": "curl"}}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `resources`: must be a list, found an object"#]],
    );
}

#[test]
fn adoption_with_unknown_key() {
    check(
        r#"{"version": 1, "resources": [], "adoption": {"token": ["web"]}}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `adoption.token`: unknown field `token`, expected `taken`"#]],
    );
}

#[test]
fn adoption_that_is_not_an_object() {
    check(
        r#"{"version": 1, "resources": [], "adoption": "web"}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          declaration, field `adoption`: must be an object such as {"taken": ["web"]}, found a string"#]],
    );
}

// A resource's identity and type.

#[test]
fn resource_not_an_object() {
    check(
        r#"{"version": 1, "resources": ["web.root"]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0]: a resource is an object, found a string"#]],
    );
}

#[test]
fn missing_id() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "path": "/srv/web"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0], field `id`: missing; every resource has an id"#]],
    );
}

#[test]
fn id_not_a_string() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": 7, "path": "/srv/web"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0], field `id`: must be a string, found a number"#]],
    );
}

#[test]
fn id_upper_case() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "Web.root", "path": "/srv/web"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0], field `id`: "Web.root" is not an id: ids are lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"#]],
    );
}

#[test]
fn id_leading_dot() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": ".web", "path": "/srv/web"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0], field `id`: ".web" is not an id: ids are lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"#]],
    );
}

#[test]
fn bad_id_and_a_bad_field() {
    // With no readable id, the field's problem still names the resource by its index.
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "Web", "path": "srv"}]}"#,
        expect![[r#"
            the declaration was refused (2 problems); nothing on the machine was touched
              resources[0], field `id`: "Web" is not an id: ids are lower-case letters, digits, '.', '_' and '-', starting with a letter or digit
              resources[0], field `path`: "srv" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn duplicate_ids() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "directory", "id": "web.root", "path": "/srv/web"},
            {"type": "package", "id": "web.root", "package": "nginx"}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[1] (id "web.root"), field `id`: duplicate id: resources[0] already has it"#]],
    );
}

#[test]
fn missing_type() {
    check(
        r#"{"version": 1, "resources": [{"id": "web.root", "path": "/srv/web"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.root"), field `type`: missing; every resource has a type"#]],
    );
}

#[test]
fn unknown_type() {
    check(
        r#"{"version": 1, "resources": [{"type": "folder", "id": "web.root", "path": "/srv/web"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `type`: "folder" is not a resource type; the types are directory, file, access, package, service, container, network, user, archive, process, action, opening"#]],
    );
}

// Fields of one resource: keys and value types.

#[test]
fn unknown_key_typo() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web", "mdoe": "0750"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `mdoe`: unknown field `mdoe`, expected one of `path`, `mode`, `owner`"#]],
    );
}

#[test]
fn mode_as_a_number() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "web.env", "path": "/etc/web.env", "content": "", "mode": 644}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.env"), field `mode`: invalid type: integer `644`, expected a string of three or four octal digits, such as "0644""#]],
    );
}

#[test]
fn create_once_as_a_string() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "web.env", "path": "/etc/web.env", "content": "", "create-once": "yes"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.env"), field `create-once`: invalid type: string "yes", expected a boolean"#]],
    );
}

#[test]
fn service_state_unknown() {
    check(
        r#"{"version": 1, "resources": [{"type": "service", "id": "proxy.nginx", "unit": "nginx.service", "state": "started"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.nginx"), field `state`: unknown variant `started`, expected `running` or `stopped`"#]],
    );
}

#[test]
fn name_with_whitespace() {
    check(
        r#"{"version": 1, "resources": [{"type": "network", "id": "web.net", "name": "web net"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.net"), field `name`: "web net" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

// Required fields, type by type.

#[test]
fn file_missing_path() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "web.env", "content": "PORT=8080\n"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.env"), field `path`: missing field `path`"#]],
    );
}

#[test]
fn service_missing_unit() {
    check(
        r#"{"version": 1, "resources": [{"type": "service", "id": "proxy.nginx", "state": "running"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "proxy.nginx"), field `unit`: missing field `unit`"#]],
    );
}

#[test]
fn service_missing_state() {
    check(
        r#"{"version": 1, "resources": [{"type": "service", "id": "proxy.nginx", "unit": "nginx.service"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.nginx"), field `state`: missing field `state`"#]],
    );
}

#[test]
fn container_missing_name() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "image": "local/web:1"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `name`: missing field `name`"#]],
    );
}

#[test]
fn container_missing_image() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.app"), field `image`: missing field `image`"#]],
    );
}

#[test]
fn process_missing_command() {
    check(
        r#"{"version": 1, "resources": [{"type": "process", "id": "backup.agent", "name": "backup-agent"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "backup.agent"), field `command`: missing field `command`"#]],
    );
}

#[test]
fn action_missing_verify() {
    check(
        r#"{"version": 1, "resources": [{"type": "action", "id": "db.migrate", "command": ["web", "migrate"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.migrate"), field `verify`: missing field `verify`"#]],
    );
}

#[test]
fn opening_missing_port() {
    check(
        r#"{"version": 1, "resources": [{"type": "opening", "id": "proxy.http", "protocol": "tcp"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "proxy.http"), field `port`: missing field `port`"#]],
    );
}

// Paths, modes and owners.

#[test]
fn relative_path() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "srv/web"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.root"), field `path`: "srv/web" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn dot_dot_segment() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web/../etc"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `path`: "/srv/web/../etc" has a '..' segment; write the path it means"#]],
    );
}

#[test]
fn empty_segment() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv//web"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.root"), field `path`: "/srv//web" has an empty segment ('//'); write the path it means"#]],
    );
}

#[test]
fn relative_env_file() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "env-file": ["/etc/web/web.env", "web.env"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `env-file[1]`: "web.env" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn every_bad_element_of_a_list_is_named_at_its_declared_index() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
            "env-file": ["web.env", "/etc/web/web.env", "other.env", "/etc/web/more.env", "last.env"]}]}"#,
        expect![[r#"
            the declaration was refused (3 problems); nothing on the machine was touched
              resources[0] (id "web.app"), field `env-file[0]`: "web.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[2]`: "other.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[4]`: "last.env" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn past_eight_bad_elements_of_a_list_the_ninth_is_named_and_the_rest_not_read() {
    // Each bad element costs a read of the resource; a list of a million must not cost a million.
    let files: Vec<String> = (0..20).map(|i| format!("\"web{i}.env\"")).collect();
    check(
        &format!(
            r#"{{"version": 1, "resources": [{{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "env-file": [{}]}}]}}"#,
            files.join(", ")
        ),
        expect![[r#"
            the declaration was refused (9 problems); nothing on the machine was touched
              resources[0] (id "web.app"), field `env-file[0]`: "web0.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[1]`: "web1.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[2]`: "web2.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[3]`: "web3.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[4]`: "web4.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[5]`: "web5.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[6]`: "web6.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[7]`: "web7.env" is a relative path; paths must be absolute
              resources[0] (id "web.app"), field `env-file[8]`: "web8.env" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn in_a_list_of_more_than_a_thousand_the_first_bad_element_is_named_and_the_rest_not_read() {
    let mut files = vec!["\"/etc/web.env\""; 1_001];
    files[500] = "\"web.env\"";
    files[1_000] = "\"other.env\"";
    check(
        &format!(
            r#"{{"version": 1, "resources": [{{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "env-file": [{}]}}]}}"#,
            files.join(", ")
        ),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `env-file[500]`: "web.env" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn mode_not_octal() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web", "mode": "0999"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `mode`: "0999" is not a mode: write three or four octal digits, such as "0644""#]],
    );
}

#[test]
fn mode_too_short() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web", "mode": "64"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `mode`: "64" is not a mode: write three or four octal digits, such as "0644""#]],
    );
}

#[test]
fn mode_too_long() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web", "mode": "07777"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `mode`: "07777" is not a mode: write three or four octal digits, such as "0644""#]],
    );
}

#[test]
fn bad_owner() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web", "owner": "www data"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `owner`: "www data" is not an owner: write "user" or "user:group" with account names"#]],
    );
}

#[test]
fn owner_with_empty_group() {
    check(
        r#"{"version": 1, "resources": [{"type": "directory", "id": "web.root", "path": "/srv/web", "owner": "www-data:"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.root"), field `owner`: "www-data:" is not an owner: write "user" or "user:group" with account names"#]],
    );
}

// Files.

#[test]
fn file_with_content_and_bytes() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "web.env", "path": "/etc/web.env", "content": "PORT=8080\n", "bytes": "UE9SVD04MDgwCg=="}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.env"), field `bytes`: a file has exactly one of `content`, `bytes` or `sealed`; found content and bytes"#]],
    );
}

#[test]
fn file_with_nothing_to_write() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "web.env", "path": "/etc/web.env"}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "web.env"), field `content`: a file has exactly one of `content`, `bytes` or `sealed`; none was given"#]],
    );
}

#[test]
fn bytes_not_base64() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "web.logo", "path": "/srv/web/logo.png", "bytes": "not base64!"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.logo"), field `bytes`: is not standard base64"#]],
    );
}

#[test]
fn archive_bytes_not_base64() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web", "bytes": "not base64!"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `bytes`: is not standard base64"#]],
    );
}

#[test]
fn secret_hole_without_a_secret() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "db.env", "path": "/etc/db.env",
            "content": "USER=app\nPASSWORD=${secret:db_password}\n", "secrets": {"db_user": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.env"), field `content`: `${secret:db_password}` names a secret that `secrets` does not declare"#]],
    );
}

/// A value pasted in the clear by mistake is refused with the declaration, naming its field,
/// and is not quoted back: the message may end up in a log.
#[test]
fn a_sealed_value_that_is_not_age() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "file", "id": "db.env", "path": "/etc/db.env", "content": "PW=${secret:pw}\n",
             "secrets": {"pw": "hunter2", "ok": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}},
            {"type": "file", "id": "db.key", "path": "/etc/db.key", "sealed": "age1qyqszqgpqyqszqgpqyqszqgpqyqszqgp"}]}"#,
        expect![[r#"
            the declaration was refused (2 problems); nothing on the machine was touched
              resources[0] (id "db.env"), field `secrets.pw`: is not a sealed value: armored age text (`-----BEGIN AGE ENCRYPTED FILE-----` ... `-----END AGE ENCRYPTED FILE-----`), or base64 of a binary age value, as `mesh-host seal` or `age -r` make
              resources[1] (id "db.key"), field `sealed`: is not a sealed value: armored age text (`-----BEGIN AGE ENCRYPTED FILE-----` ... `-----END AGE ENCRYPTED FILE-----`), or base64 of a binary age value, as `mesh-host seal` or `age -r` make"#]],
    );
}

#[test]
fn secrets_without_content() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "db.env", "path": "/etc/db.env",
            "bytes": "", "secrets": {"db_password": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.env"), field `secrets`: secrets fill `${secret:NAME}` holes in `content`, and this file has no `content`"#]],
    );
}

#[test]
fn into_json_content_not_an_object() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "app.settings", "path": "/etc/app/settings.json",
            "content": "[\"debug\"]", "into": "json"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "app.settings"), field `content`: with `"into": "json"`, content must be a JSON object"#]],
    );
}

#[test]
fn into_env_line_not_key_value() {
    check(
        r##"{"version": 1, "resources": [{"type": "file", "id": "app.env", "path": "/etc/app/app.env",
            "content": "# set by the mesh\nPORT=8080\nDEBUG\n", "into": "env"}]}"##,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "app.env"), field `content`: with `"into": "env"`, line 3 is not KEY=VALUE"#]],
    );
}

#[test]
fn into_secret_hole_in_a_key() {
    check(
        r##"{"version": 1, "resources": [
            {"type": "file", "id": "app.settings", "path": "/etc/app/settings.json", "into": "json",
             "content": "{\"${secret:k}\": 1, \"password\": \"${secret:k}\"}", "secrets": {"k": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}},
            {"type": "file", "id": "app.env", "path": "/etc/app/app.env", "into": "env",
             "content": "# ${secret:k}=comment\nPASSWORD=${secret:k}\nX${secret:k}=1\n", "secrets": {"k": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}}]}"##,
        expect![[r#"
            the declaration was refused (2 problems); nothing on the machine was touched
              resources[0] (id "app.settings"), field `content`: with `"into"`, a `${secret:NAME}` hole fills a value, not a key: "${secret:k}"
              resources[1] (id "app.env"), field `content`: with `"into"`, a `${secret:NAME}` hole fills a value, not a key (line 3)"#]],
    );
}

#[test]
fn into_with_create_once() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "app.env", "path": "/etc/app/app.env",
            "content": "PORT=8080\n", "into": "env", "create-once": true}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "app.env"), field `into`: `into` and `create-once` cannot be combined: the first owns keys in a file, the second leaves the whole file alone"#]],
    );
}

#[test]
fn two_files_at_the_same_path() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "file", "id": "web.env", "path": "/etc/web/web.env", "content": "PORT=8080\n"},
            {"type": "file", "id": "api.env", "path": "/etc/web/web.env", "content": "PORT=9090\n"}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[1] (id "api.env"), field `path`: "/etc/web/web.env" is already declared by resources[0]"#]],
    );
}

// Restart-on and reload-on.

#[test]
fn restart_on_undeclared() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "file", "id": "proxy.conf", "path": "/etc/nginx/conf.d/web.conf", "content": ""},
            {"type": "service", "id": "proxy.nginx", "unit": "nginx.service", "state": "running", "restart-on": ["proxy.conf", "proxy.cert"]}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[1] (id "proxy.nginx"), field `restart-on[1]`: "proxy.cert" is not declared"#]],
    );
}

#[test]
fn reload_on_itself() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "service", "id": "proxy.nginx", "unit": "nginx.service", "state": "running", "reload-on": ["proxy.nginx"]}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.nginx"), field `reload-on[0]`: a resource cannot reload on itself"#]],
    );
}

#[test]
fn restart_on_named_twice() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "file", "id": "web.env", "path": "/etc/web/web.env", "content": ""},
            {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "restart-on": ["web.env", "web.env"]}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[1] (id "web.app"), field `restart-on[1]`: "web.env" is named twice"#]],
    );
}

#[test]
fn restart_on_not_an_id() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "process", "id": "web.worker", "name": "worker", "command": ["worker"], "restart-on": ["Web.Env"]}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.worker"), field `restart-on[0]`: "Web.Env" is not an id: ids are lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"#]],
    );
}

// Services.

#[test]
fn service_unit_without_suffix() {
    check(
        r#"{"version": 1, "resources": [{"type": "service", "id": "proxy.nginx", "unit": "nginx", "state": "running"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.nginx"), field `unit`: "nginx" is not a unit name: give its suffix, such as "nginx.service""#]],
    );
}

// Openings.

#[test]
fn port_0() {
    check(
        r#"{"version": 1, "resources": [{"type": "opening", "id": "proxy.http", "port": 0}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "proxy.http"), field `port`: 0 is not a port: ports are 1 to 65535"#]],
    );
}

#[test]
fn port_70000() {
    check(
        r#"{"version": 1, "resources": [{"type": "opening", "id": "proxy.http", "port": 70000}]}"#,
        expect![[r#"
        the declaration was refused (1 problem); nothing on the machine was touched
          resources[0] (id "proxy.http"), field `port`: 70000 is not a port: ports are 1 to 65535"#]],
    );
}

#[test]
fn port_as_a_string() {
    check(
        r#"{"version": 1, "resources": [{"type": "opening", "id": "proxy.http", "port": "80"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.http"), field `port`: invalid type: string "80", expected a port number, 1 to 65535"#]],
    );
}

#[test]
fn protocol_icmp() {
    check(
        r#"{"version": 1, "resources": [{"type": "opening", "id": "proxy.ping", "port": 1, "protocol": "icmp"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.ping"), field `protocol`: unknown variant `icmp`, expected `tcp` or `udp`"#]],
    );
}

#[test]
fn bad_cidr_in_from() {
    check(
        r#"{"version": 1, "resources": [{"type": "opening", "id": "proxy.http", "port": 80, "from": ["10.0.0.0/8", "10.0.0.0/33"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "proxy.http"), field `from[1]`: "10.0.0.0/33" is not a CIDR such as "10.0.0.0/8" or "fd00::/8""#]],
    );
}

#[test]
fn two_openings_of_the_same_port() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "opening", "id": "proxy.http", "port": 80},
            {"type": "opening", "id": "web.http", "port": 80, "protocol": "tcp"}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[1] (id "web.http"), field `port`: "80/tcp" is already declared by resources[0]"#]],
    );
}

// Containers.

#[test]
fn bad_cron_schedule() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "db.backup", "name": "db-backup", "image": "local/backup:1", "schedule": "61 3 * * *"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.backup"), field `schedule`: "61 3 * * *": "61" is not a cron field between 0 and 59"#]],
    );
}

#[test]
fn cron_with_six_fields() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "db.backup", "name": "db-backup", "image": "local/backup:1", "schedule": "0 0 3 * * *"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.backup"), field `schedule`: "0 0 3 * * *" is not a 5-field cron expression (minute hour day month weekday)"#]],
    );
}

#[test]
fn run_once_with_schedule() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "db.backup", "name": "db-backup", "image": "local/backup:1", "run-once": true, "schedule": "0 3 * * *"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.backup"), field `schedule`: a container is either `run-once` or on a `schedule`, not both"#]],
    );
}

#[test]
fn bad_container_port_mapping() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "ports": ["8080:80", "8080:http"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `ports[1]`: "8080:http" is not a port mapping such as "8080:80" or "127.0.0.1:8080:80/tcp""#]],
    );
}

#[test]
fn bad_volume() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "volumes": ["/srv/web:data"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `volumes[0]`: "/srv/web:data" is not a volume such as "/srv/data:/data" or "name:/data:ro""#]],
    );
}

#[test]
fn bad_hosts_entry() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "hosts": ["db:10.0.0.5", "cache"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `hosts[1]`: "cache" is not "name:ip" or "name:host-gateway""#]],
    );
}

#[test]
fn every_bad_port_volume_and_host_of_a_container_is_named() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
            "ports": ["8080:http", "80", "70000"], "volumes": ["/srv/web:data", "data:/data", "web/data:/data"],
            "hosts": ["cache", "db:10.0.0.5"]}]}"#,
        expect![[r#"
            the declaration was refused (5 problems); nothing on the machine was touched
              resources[0] (id "web.app"), field `hosts[0]`: "cache" is not "name:ip" or "name:host-gateway"
              resources[0] (id "web.app"), field `ports[0]`: "8080:http" is not a port mapping such as "8080:80" or "127.0.0.1:8080:80/tcp"
              resources[0] (id "web.app"), field `ports[2]`: "70000" is not a port mapping such as "8080:80" or "127.0.0.1:8080:80/tcp"
              resources[0] (id "web.app"), field `volumes[0]`: "/srv/web:data" is not a volume such as "/srv/data:/data" or "name:/data:ro"
              resources[0] (id "web.app"), field `volumes[2]`: "web/data:/data" is not a volume such as "/srv/data:/data" or "name:/data:ro""#]],
    );
}

#[test]
fn env_name_with_equals() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "env": {"PORT=8080": ""}}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `env.PORT=8080`: is not an environment variable name"#]],
    );
}

#[test]
fn env_names_of_a_process_every_bad_one_named() {
    check(
        r#"{"version": 1, "resources": [{"type": "process", "id": "web.worker", "name": "worker", "command": ["worker"],
            "env": {"": "x", "QUEUE": "default", "A=B": "y"}}]}"#,
        expect![[r#"
            the declaration was refused (2 problems); nothing on the machine was touched
              resources[0] (id "web.worker"), field `env.`: is not an environment variable name
              resources[0] (id "web.worker"), field `env.A=B`: is not an environment variable name"#]],
    );
}

#[test]
fn image_with_whitespace() {
    // An image reference holds '/' (the spec's own example is "local/web:1"), but never a space.
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web 1"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `image`: "local/web 1" is not an image reference such as "nginx:1.27" or "registry.example/web:1""#]],
    );
}

#[test]
fn two_containers_with_one_name() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1"},
            {"type": "container", "id": "web.next", "name": "web", "image": "local/web:2"}
        ]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[1] (id "web.next"), field `name`: "web" is already declared by resources[0]"#]],
    );
}

// Archives.

#[test]
fn archive_with_bytes_and_source() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static", "bytes": "", "source": "/var/cache/static.tar"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `source`: an archive has exactly one of `bytes` or `source`; found bytes and source"#]],
    );
}

#[test]
fn archive_from_a_source_without_a_digest_is_refused_unless_unverified() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static", "source": "/var/cache/static.tar"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `digest`: an archive from a `source` needs its `digest`, or whoever can write /var/cache/static.tar chooses what root unpacks into /srv/web/static: add `"digest": "sha256:..."` (`sha256sum /var/cache/static.tar`), or `"unverified": true` to accept it unchecked"#]],
    );
    let unverified = r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static", "source": "/var/cache/static.tar", "unverified": true}]}"#;
    assert!(Declaration::parse(unverified.as_bytes()).is_ok());
    check(
        &format!(
            r#"{{"version": 1, "resources": [{{"type": "archive", "id": "web.static", "path": "/srv/web/static", "source": "/var/cache/static.tar", "digest": "{}", "unverified": true}}]}}"#,
            "0".repeat(64)
        ),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `unverified`: `unverified` accepts a `source` without a `digest`, and this archive gives its `digest`: remove `unverified`"#]],
    );
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static", "bytes": "", "unverified": true}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `unverified`: `unverified` is for a `source` on the machine; `bytes` are the declaration's own: remove `unverified`"#]],
    );
}

#[test]
fn archive_with_neither_bytes_nor_source() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `bytes`: an archive has exactly one of `bytes` or `source`; none was given"#]],
    );
}

#[test]
fn archive_digest_not_hex() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static", "source": "/var/cache/static.tar",
            "digest": "sha256:zz49a4f3bd5e7c1c0b2f1c87a3f6f5bfcf3c8c3a8d6a0f0b5e1c9f2a7d3b8e4c"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `digest`: "sha256:zz49a4f3bd5e7c1c0b2f1c87a3f6f5bfcf3c8c3a8d6a0f0b5e1c9f2a7d3b8e4c" is not a sha256 digest (64 lower-case hex digits)"#]],
    );
}

// Commands.

#[test]
fn empty_command_list() {
    check(
        r#"{"version": 1, "resources": [{"type": "action", "id": "db.migrate", "command": [], "verify": ["migrate", "--check"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.migrate"), field `command`: an empty command: give the program and its arguments as a list"#]],
    );
}

#[test]
fn command_as_a_shell_string() {
    check(
        r#"{"version": 1, "resources": [{"type": "process", "id": "web.worker", "name": "worker", "command": "worker --queue default"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.worker"), field `command`: invalid type: string "worker --queue default", expected a sequence"#]],
    );
}

#[test]
fn a_command_whose_only_element_is_bad_is_not_also_called_empty() {
    check(
        r#"{"version": 1, "resources": [{"type": "action", "id": "db.migrate", "command": [5], "verify": ["migrate", "--check"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.migrate"), field `command[0]`: invalid type: integer `5`, expected a string"#]],
    );
}

// Several problems at once: every one is listed, the declaration's own first, then each
// resource's in order, then those between resources (duplicates, references).

#[test]
fn several_problems_at_once() {
    check(
        r#"{"version": 2, "extra": true, "resources": [
            {"type": "directory", "id": "web.root", "path": "srv/web"},
            {"type": "file", "id": "web.env", "path": "/etc/web.env", "content": "a", "bytes": "YQ=="},
            {"type": "file", "id": "web.env", "path": "/etc/web.env2", "content": "b"},
            {"type": "file", "id": "web.dup", "path": "/etc/web.env", "content": "c"},
            {"type": "opening", "id": "web.http", "port": 0},
            {"type": "service", "id": "web.svc", "unit": "web", "state": "running", "restart-on": ["web.gone"]}
        ]}"#,
        expect![[r#"
            the declaration was refused (9 problems); nothing on the machine was touched
              declaration, field `version`: 2 is not a version this build understands (it understands [1])
              declaration, field `extra`: unknown key; the declaration has `version`, `resources` and `adoption`
              resources[0] (id "web.root"), field `path`: "srv/web" is a relative path; paths must be absolute
              resources[1] (id "web.env"), field `bytes`: a file has exactly one of `content`, `bytes` or `sealed`; found content and bytes
              resources[4] (id "web.http"), field `port`: 0 is not a port: ports are 1 to 65535
              resources[5] (id "web.svc"), field `unit`: "web" is not a unit name: give its suffix, such as "web.service"
              resources[2] (id "web.env"), field `id`: duplicate id: resources[1] already has it
              resources[3] (id "web.dup"), field `path`: "/etc/web.env" is already declared by resources[1]
              resources[5] (id "web.svc"), field `restart-on[0]`: "web.gone" is not declared"#]],
    );
}

// What is accepted, and what the parser gives back.

/// One line a resource: index, id, type and target, as a person would list them.
fn summary(d: &Declaration) -> String {
    d.resources.iter().map(|r| format!("{} {} {} {}\n", r.index(), r.id, r.kind(), r.target())).collect()
}

/// The example of the contract (`spec/declaration.md`), as written there.
const SPEC_EXAMPLE: &str = r#"{
  "version": 1,
  "resources": [
    {"type": "directory", "id": "web.root", "path": "/srv/web", "mode": "0755", "owner": "www-data:www-data"},
    {"type": "file", "id": "web.env", "path": "/etc/web/web.env", "content": "PORT=8080\n", "mode": "0640"},
    {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
     "env-file": ["/etc/web/web.env"], "ports": ["127.0.0.1:8080:8080"]},
    {"type": "file", "id": "proxy.conf", "path": "/etc/nginx/conf.d/web.conf",
     "content": "server { listen 80; location / { proxy_pass http://127.0.0.1:8080; } }\n"},
    {"type": "service", "id": "proxy.nginx", "unit": "nginx.service", "state": "running",
     "boot": "enabled", "restart-on": ["proxy.conf"]}
  ]
}"#;

/// The example grown to use all twelve types, with most optional fields set.
const EVERY_TYPE: &str = r##"{
  "version": 1,
  "adoption": {"taken": ["web", "proxy"]},
  "resources": [
    {"type": "user", "id": "web.user", "name": "web", "system": true, "uid": 990, "group": "web",
     "groups": ["adm"], "home": "/var/lib/web", "shell": "/usr/sbin/nologin"},
    {"type": "directory", "id": "web.root", "path": "/srv/web", "mode": "0755", "owner": "web:web"},
    {"type": "archive", "id": "web.static", "path": "/srv/web/static", "source": "/var/cache/web/static.tar.gz",
     "digest": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
    {"type": "access", "id": "web.uploads", "path": "/mnt/uploads", "mode": "write"},
    {"type": "file", "id": "web.env", "path": "/etc/web/web.env",
     "content": "PORT=8080\nDB_PASSWORD=${secret:db}\n", "secrets": {"db": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}, "mode": "0640"},
    {"type": "file", "id": "web.logo", "path": "/srv/web/logo.png", "bytes": "iVBORw0KGgo="},
    {"type": "file", "id": "web.tls-key", "path": "/etc/web/tls.key", "sealed": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg==", "owner": "web"},
    {"type": "file", "id": "web.settings", "path": "/etc/web/settings.json", "content": "{\"debug\": false}", "into": "json"},
    {"type": "file", "id": "web.local", "path": "/etc/web/local.conf", "content": "# yours\n", "create-once": true},
    {"type": "network", "id": "web.net", "name": "web"},
    {"type": "container", "id": "web.migrate", "name": "web-migrate", "image": "local/web:1",
     "args": ["migrate"], "network": "web", "run-once": true},
    {"type": "container", "id": "web.app", "name": "web", "image": "registry.example:5000/team/web:1",
     "env": {"MODE": "production"}, "env-file": ["/etc/web/web.env"], "ports": ["127.0.0.1:8080:8080", "[::1]:8081:8081/tcp"],
     "volumes": ["/srv/web:/srv/web:ro", "web-data:/data"], "network": "web", "hosts": ["db:10.0.0.5", "db6:fd00::5"],
     "restart-on": ["web.env", "web.settings"]},
    {"type": "container", "id": "web.backup", "name": "web-backup", "image": "local/web:1", "schedule": "*/15 3-5 * * 1,3"},
    {"type": "action", "id": "web.seed", "command": ["web", "seed"], "verify": ["web", "seed", "--check"], "in": "web"},
    {"type": "process", "id": "web.worker", "name": "web-worker", "command": ["/usr/local/bin/web-worker", "--queue", "default"],
     "env": {"QUEUE": "default"}, "user": "web", "restart-on": ["web.env"]},
    {"type": "package", "id": "proxy.pkg", "package": "nginx"},
    {"type": "file", "id": "proxy.conf", "path": "/etc/nginx/conf.d/web.conf", "content": "server { listen 80; }\n"},
    {"type": "service", "id": "proxy.nginx", "unit": "nginx.service", "state": "running", "boot": "enabled",
     "restart-on": ["proxy.pkg"], "reload-on": ["proxy.conf", "web.env"]},
    {"type": "opening", "id": "proxy.http", "port": 80, "from": ["10.0.0.0/8", "fd00::/8", "192.0.2.7"]},
    {"type": "opening", "id": "proxy.dns", "port": 53, "protocol": "udp"}
  ]
}"##;

#[test]
fn the_spec_example_parses() {
    let d = parsed(SPEC_EXAMPLE);
    expect![[r#"
        0 web.root directory /srv/web
        1 web.env file /etc/web/web.env
        2 web.app container web
        3 proxy.conf file /etc/nginx/conf.d/web.conf
        4 proxy.nginx service nginx.service
    "#]]
    .assert_eq(&summary(&d));
    assert!(d.adoption.is_none());
}

#[test]
fn every_type_parses() {
    let d = parsed(EVERY_TYPE);
    let kinds: std::collections::BTreeSet<Kind> = d.resources.iter().map(Resource::kind).collect();
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), Kind::ALL.to_vec(), "every type appears");
    expect![[r#"
        0 web.user user web
        1 web.root directory /srv/web
        2 web.static archive /srv/web/static
        3 web.uploads access /mnt/uploads
        4 web.env file /etc/web/web.env
        5 web.logo file /srv/web/logo.png
        6 web.tls-key file /etc/web/tls.key
        7 web.settings file /etc/web/settings.json
        8 web.local file /etc/web/local.conf
        9 web.net network web
        10 web.migrate container web-migrate
        11 web.app container web
        12 web.backup container web-backup
        13 web.seed action web seed
        14 web.worker process web-worker
        15 proxy.pkg package nginx
        16 proxy.conf file /etc/nginx/conf.d/web.conf
        17 proxy.nginx service nginx.service
        18 proxy.http opening 80/tcp
        19 proxy.dns opening 53/udp
    "#]]
    .assert_eq(&summary(&d));
    assert_eq!(
        d.adoption.as_ref().map(|a| a.taken.clone()),
        Some(vec!["web".to_owned(), "proxy".to_owned()])
    );
    let gates: Vec<&str> = d.resources.iter().filter(|r| r.spec.is_gate()).map(|r| r.id.as_str()).collect();
    assert_eq!(gates, ["web.migrate", "web.seed"]);
    assert_eq!(d.find("web.app").map(|r| r.index()), Some(11));
    assert!(d.find("web.gone").is_none());
    assert!(d.find("Not An Id").is_none());
}

#[test]
fn an_empty_declaration_parses() {
    let d = parsed(r#"{"version": 1, "resources": []}"#);
    assert!(d.resources.is_empty());
}

#[test]
fn defaults() {
    let d = parsed(EVERY_TYPE);
    let file = |id: &str| match &d.find(id).expect("declared").spec {
        Spec::File(f) => f.clone(),
        other => panic!("{id} is a {}", other.kind()),
    };
    // Without a secret a file is 0644; carrying one (sealed, or through `secrets`) makes it 0600,
    // and a declared mode wins over either.
    assert_eq!(file("web.logo").mode(), Mode::new(0o644));
    assert_eq!(file("web.tls-key").mode(), Mode::new(0o600));
    assert_eq!(file("web.env").mode(), Mode::new(0o640));
    let with_secrets = parsed(
        r#"{"version": 1, "resources": [{"type": "file", "id": "db.env", "path": "/etc/db.env",
            "content": "PASSWORD=${secret:pw}\n", "secrets": {"pw": "YWdlLWVuY3J5cHRpb24ub3JnL3YxCg=="}}]}"#,
    );
    match &with_secrets.resources[0].spec {
        Spec::File(f) => {
            assert!(f.mode.is_none(), "the parser records only what was declared");
            assert_eq!(f.mode(), Mode::new(0o600));
            assert_eq!(f.mode().to_string(), "0600");
        }
        other => panic!("a {}", other.kind()),
    }
    assert!(!file("web.logo").create_once);
    assert!(file("web.logo").into.is_none());

    // A directory's default mode is the applier's to apply: the parser leaves it unset.
    let dir =
        parsed(r#"{"version": 1, "resources": [{"type": "directory", "id": "a.dir", "path": "/srv/a/"}]}"#);
    match &dir.resources[0].spec {
        Spec::Directory(dir) => {
            assert!(dir.mode.is_none());
            assert!(dir.owner.is_none());
            assert_eq!(dir.path.to_string(), "/srv/a", "a trailing '/' is dropped");
        }
        other => panic!("a {}", other.kind()),
    }

    let defaults = parsed(
        r#"{"version": 1, "resources": [
            {"type": "access", "id": "a.access", "path": "/mnt/a"},
            {"type": "opening", "id": "a.port", "port": 443},
            {"type": "container", "id": "a.app", "name": "a", "image": "a"},
            {"type": "user", "id": "a.user", "name": "a"}
        ]}"#,
    );
    let spec = |i: usize| &defaults.resources[i].spec;
    assert!(matches!(spec(0), Spec::Access(a) if a.mode == AccessMode::Read));
    assert!(matches!(spec(1), Spec::Opening(o) if o.protocol == Protocol::Tcp && o.from.is_empty()));
    assert_eq!(spec(1).target(), "443/tcp");
    assert!(
        matches!(spec(2), Spec::Container(c) if !c.run_once && c.schedule.is_none() && c.restart_on.is_empty())
    );
    assert!(!spec(2).is_gate());
    assert!(matches!(spec(3), Spec::User(u) if !u.system && u.uid.is_none() && u.groups.is_empty()));
}

#[test]
fn id_module() {
    let module = |s: &str| Id::parse(s).expect("an id").module().to_owned();
    assert_eq!(module("postgres.server"), "postgres");
    assert_eq!(module("postgres.server.conf"), "postgres");
    assert_eq!(module("postgres"), "postgres");
    assert_eq!(module("web-1_a.x"), "web-1_a");
    assert!(Id::parse("").is_err());
    assert!(Id::parse("-web").is_err());
    assert!(Id::parse("web app").is_err());
}

#[test]
fn dependents() {
    let d = parsed(EVERY_TYPE);
    let of = |id: &str| -> Vec<String> {
        let id = Id::parse(id).expect("an id");
        d.dependents(&id).map(|r| r.id.to_string()).collect()
    };
    // Restart-on and reload-on both count, in declaration order.
    assert_eq!(of("web.env"), ["web.app", "web.worker", "proxy.nginx"]);
    assert_eq!(of("proxy.conf"), ["proxy.nginx"]);
    assert_eq!(of("proxy.pkg"), ["proxy.nginx"]);
    assert_eq!(of("web.settings"), ["web.app"]);
    assert!(of("web.app").is_empty());
    assert!(of("web.gone").is_empty());
}

#[test]
fn digest_follows_the_declaration_not_its_layout() {
    let digest_of = |resource: &str| {
        let d = parsed(&format!(r#"{{"version": 1, "resources": [{resource}]}}"#));
        d.resources[0].digest
    };
    let base = digest_of(
        r#"{"type": "file", "id": "a.conf", "path": "/etc/a.conf", "content": "x=1\n", "mode": "0640"}"#,
    );
    let text = base.to_string();
    assert!(text.starts_with("sha256:") && text.len() == 71, "{text}");

    // The same resource with its keys in another order and other whitespace: the same digest.
    let reordered = digest_of(
        r#"{ "mode":"0640",
             "content":"x=1\n", "path":"/etc/a.conf", "id":"a.conf", "type":"file" }"#,
    );
    assert_eq!(base, reordered);

    // Any field that changes changes the digest.
    for changed in [
        r#"{"type": "file", "id": "a.conf", "path": "/etc/a.conf", "content": "x=2\n", "mode": "0640"}"#,
        r#"{"type": "file", "id": "a.conf", "path": "/etc/a.conf", "content": "x=1\n", "mode": "0600"}"#,
        r#"{"type": "file", "id": "a.conf", "path": "/etc/b.conf", "content": "x=1\n", "mode": "0640"}"#,
        r#"{"type": "file", "id": "a.conf", "path": "/etc/a.conf", "content": "x=1\n", "mode": "0640", "create-once": true}"#,
        r#"{"type": "file", "id": "a.conf", "path": "/etc/a.conf", "content": "x=1\n"}"#,
    ] {
        assert_ne!(base, digest_of(changed), "{changed}");
    }

    // Nested maps are ordered too: env keys in another order are the same container.
    let env_ab = digest_of(
        r#"{"type": "container", "id": "a.app", "name": "a", "image": "a", "env": {"A": "1", "B": "2"}}"#,
    );
    let env_ba = digest_of(
        r#"{"type": "container", "id": "a.app", "name": "a", "image": "a", "env": {"B": "2", "A": "1"}}"#,
    );
    assert_eq!(env_ab, env_ba);
    // A list is ordered: its order is part of the declaration.
    let args_ab =
        digest_of(r#"{"type": "container", "id": "a.app", "name": "a", "image": "a", "args": ["a", "b"]}"#);
    let args_ba =
        digest_of(r#"{"type": "container", "id": "a.app", "name": "a", "image": "a", "args": ["b", "a"]}"#);
    assert_ne!(args_ab, args_ba);
}

#[test]
fn json_schema_names_every_type_and_refuses_unknown_keys() {
    let schema = json_schema();
    assert_eq!(schema["additionalProperties"], serde_json::json!(false));
    assert_eq!(schema["required"], serde_json::json!(["version", "resources"]));
    assert_eq!(schema["properties"]["version"], serde_json::json!({"const": 1}));

    let items = &schema["properties"]["resources"]["items"];
    let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(items["properties"]["type"]["enum"], serde_json::json!(kinds));
    let branches = items["allOf"].as_array().expect("one branch a type");
    assert_eq!(branches.len(), 12);
    for (kind, branch) in Kind::ALL.iter().zip(branches) {
        assert_eq!(branch["if"]["properties"]["type"]["const"], kind.as_str(), "{branch}");
        // Each type's own definition refuses unknown keys, as the parser does, and requires
        // `id` and `type` beside its own fields.
        let name = branch["then"]["$ref"].as_str().and_then(|r| r.strip_prefix("#/$defs/")).expect("a $ref");
        let def = &schema["$defs"][name];
        assert_eq!(def["additionalProperties"], serde_json::json!(false), "{name}");
        let required = def["required"].as_array().expect("required");
        assert!(required.contains(&"id".into()) && required.contains(&"type".into()), "{name}");
    }
    let text = schema.to_string();
    for kind in Kind::ALL {
        assert!(text.contains(&format!("\"{}\"", kind.as_str())), "{kind} is missing from the schema");
    }
}

/// A declaration large enough to be validated on two threads gives exactly what one thread
/// would: resources in order, problems in order, and rules across the halves still applied.
#[test]
fn a_large_declaration_is_validated_as_one() {
    let mut resources: Vec<serde_json::Value> = (0..3000)
        .map(|i| serde_json::json!({"type": "file", "id": format!("m.f{i}"), "path": format!("/srv/f{i}"), "content": "x"}))
        .collect();
    let good = serde_json::to_vec(&serde_json::json!({"version": 1, "resources": resources})).unwrap();
    let d = Declaration::parse(&good).unwrap();
    assert_eq!(d.resources.len(), 3000);
    assert!(d
        .resources
        .iter()
        .enumerate()
        .all(|(i, r)| r.index() == i && r.id.as_str() == format!("m.f{i}")));

    resources[10]["mode"] = serde_json::json!("999");
    resources[2990]["mode"] = serde_json::json!("888");
    resources[2999]["id"] = serde_json::json!("m.f5");
    let bad = serde_json::to_vec(&serde_json::json!({"version": 1, "resources": resources})).unwrap();
    let refused = Declaration::parse(&bad).unwrap_err();
    let at: Vec<(Option<usize>, Option<String>)> =
        refused.problems.iter().map(|p| (p.index, p.field.clone())).collect();
    assert_eq!(
        at,
        vec![
            (Some(10), Some("mode".into())),
            (Some(2990), Some("mode".into())),
            (Some(2999), Some("id".into()))
        ],
        "{refused}"
    );
}

#[test]
fn resources_are_found_by_id_and_by_managed_path() {
    let mut resources = vec![r#"{"type": "access", "id": "a.media", "path": "/srv/media"}"#.to_owned()];
    for n in 0..500 {
        resources.push(format!(r#"{{"type": "directory", "id": "a.d{n}", "path": "/srv/d{n}"}}"#));
        resources
            .push(format!(r#"{{"type": "file", "id": "a.d{n}.f", "path": "/srv/d{n}/f", "content": "x"}}"#));
    }
    let d = parsed(&format!(r#"{{"version": 1, "resources": [{}]}}"#, resources.join(",")));
    for n in [0, 1, 250, 499] {
        let file = d.find(&format!("a.d{n}.f")).expect("found by id");
        assert_eq!(file.target(), format!("/srv/d{n}/f"));
        let at = d.at_path(std::path::Path::new(&format!("/srv/d{n}/f"))).expect("found by path");
        assert_eq!(at.id.as_str(), format!("a.d{n}.f"));
        let dir = d.at_path(std::path::Path::new(&format!("/srv/d{n}"))).expect("a directory too");
        assert_eq!(dir.id.as_str(), format!("a.d{n}"));
    }
    assert!(d.find("a.d500.f").is_none() && d.find("not an id").is_none());
    assert!(d.at_path(std::path::Path::new("/srv/media")).is_none(), "an access path is not managed");
    assert!(d.at_path(std::path::Path::new("/srv/d1/g")).is_none());
    assert_eq!(d.get(&Id::parse("a.media").unwrap()).map(|r| r.index()), Some(0));
}

// Keys given twice: serde_json would keep the last one silently.

#[test]
fn a_key_given_twice_at_the_top_level() {
    check(
        r#"{"version": 1, "resources": [], "version": 1}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              declaration, field `version`: given twice in one object; a key may appear once"#]],
    );
}

#[test]
fn a_field_given_twice_in_a_resource() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "file", "id": "web.conf", "path": "/etc/web.conf", "content": "x", "mode": "0644", "mode": "0600"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.conf"), field `mode`: given twice in one object; a key may appear once"#]],
    );
}

#[test]
fn a_key_given_twice_inside_a_field() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "container", "id": "web.app", "name": "app", "image": "local/app:1",
             "env": {"PORT": "80", "MODE": "x", "PORT": "8080"}}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `env.PORT`: given twice in one object; a key may appear once"#]],
    );
}

#[test]
fn an_id_given_twice() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "directory", "id": "web.a", "path": "/srv/a", "id": "web.b"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0], field `id`: given twice in one object; a key may appear once"#]],
    );
}

// Every bad field of one resource is listed, not only the first serde met.

#[test]
fn every_bad_field_of_one_resource() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "file", "id": "web.conf", "path": "etc/web.conf", "content": "x", "mode": "644",
             "owner": "a:b:c", "colour": "blue"}]}"#,
        expect![[r#"
            the declaration was refused (3 problems); nothing on the machine was touched
              resources[0] (id "web.conf"), field `colour`: unknown field `colour`, expected one of `path`, `content`, `bytes`, `sealed`, `secrets`, `mode`, `owner`, `create-once`, `into`
              resources[0] (id "web.conf"), field `owner`: "a:b:c" is not an owner: write "user" or "user:group" with account names
              resources[0] (id "web.conf"), field `path`: "etc/web.conf" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn a_bad_field_and_a_missing_one() {
    check(
        r#"{"version": 1, "resources": [
            {"type": "container", "id": "web.app", "name": "app web", "ports": ["80:80"], "env": {"A": 1}}]}"#,
        expect![[r#"
            the declaration was refused (3 problems); nothing on the machine was touched
              resources[0] (id "web.app"), field `env.A`: invalid type: integer `1`, expected a string
              resources[0] (id "web.app"), field `name`: "app web" is not a name: it must be non-empty, with no whitespace or '/'
              resources[0] (id "web.app"), field `image`: missing field `image`"#]],
    );
}

// A directory of documents: problems name the document, and the other resource in a conflict is
// named the same way.

#[test]
fn a_conflict_across_documents_names_both_where_they_are() {
    let sources = vec![
        (
            "10-base.json".to_owned(),
            br#"{"version": 1, "resources": [
                {"type": "directory", "id": "web.root", "path": "/srv/web"},
                {"type": "file", "id": "web.conf", "path": "/etc/web.conf", "content": "a"}]}"#
                .to_vec(),
        ),
        (
            "20-more.json".to_owned(),
            br#"{"version": 1, "resources": [
                {"type": "file", "id": "web.conf", "path": "/etc/other.conf", "content": "b"},
                {"type": "file", "id": "web.again", "path": "/etc/web.conf", "content": "c"}]}"#
                .to_vec(),
        ),
    ];
    let refused = Declaration::parse_sources(&sources).expect_err("refused");
    expect![[r#"
        the declaration was refused (2 problems); nothing on the machine was touched
          20-more.json: resources[0] (id "web.conf"), field `id`: duplicate id: resources[1] of 10-base.json already has it
          20-more.json: resources[1] (id "web.again"), field `path`: "/etc/web.conf" is already declared by resources[1] of 10-base.json"#]].assert_eq(&refused.to_string());
}

// Values in messages are cut: a refusal used to repeat a bad value in full (52 MB on stderr for a
// 50 MB `mode`). Each case here quotes a value of a few hundred characters, which is cut after
// 100; the 50 MB case itself runs through the binary in tests/it/malformed.rs.

/// A declaration of one file resource with `field` set to this JSON value.
fn one_file_with(field: &str, value: &str) -> String {
    format!(
        r#"{{"version": 1, "resources": [{{"type": "file", "id": "web.conf", "path": "/etc/web.conf", "content": "x", "{field}": {value}}}]}}"#
    )
}

#[test]
fn a_long_mode_is_cut_in_the_refusal() {
    check(
        &one_file_with("mode", &format!("\"{}\"", "7".repeat(300))),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.conf"), field `mode`: "7777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777777…" (300 bytes) is not a mode: write three or four octal digits, such as "0644""#]],
    );
}

#[test]
fn a_long_value_of_the_wrong_type_is_cut_in_serdes_words() {
    check(
        &one_file_with("create-once", &format!("\"{}\"", "yes".repeat(100))),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.conf"), field `create-once`: invalid type: string "yesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesyesy…" (300 bytes), expected a boolean"#]],
    );
}

#[test]
fn a_long_unknown_field_is_cut_where_it_is_named() {
    // Named twice: as the field, and by serde between backticks.
    check(
        &one_file_with(&"k".repeat(300), "1"),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.conf"), field `kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…`: unknown field `kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…` (300 bytes), expected one of `path`, `content`, `bytes`, `sealed`, `secrets`, `mode`, `owner`, `create-once`, `into`"#]],
    );
}

#[test]
fn a_long_id_is_cut_where_the_resource_is_named() {
    // A valid id, however long, names the resource; here the path is what is refused.
    let json = format!(
        r#"{{"version": 1, "resources": [{{"type": "directory", "id": "{}", "path": "srv"}}]}}"#,
        "a".repeat(300)
    );
    check(
        &json,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…"), field `path`: "srv" is a relative path; paths must be absolute"#]],
    );
}

#[test]
fn an_escape_in_a_long_value_is_never_split() {
    // 99 plain characters, then escapes: the cut falls after the first escape, whole.
    let value = format!("{}{}", "x".repeat(99), "\\u0001".repeat(50));
    check(
        &one_file_with("owner", &format!("\"{value}\"")),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.conf"), field `owner`: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\u{1}…" (349 bytes) is not an owner: write "user" or "user:group" with account names"#]],
    );
}

#[test]
fn a_long_value_shown_unquoted_is_cut_with_the_message() {
    // A version given as a list is written back as JSON, with no quotes to find; the message
    // as a whole is cut at 1,000 bytes.
    let list = vec!["1"; 2_000].join(",");
    let refusal = refused(&format!(r#"{{"version": [{list}], "resources": []}}"#));
    let line = refusal.lines().nth(1).expect("one problem");
    assert!(line.len() < 1_100, "a line of {} bytes: {line}", line.len());
    assert!(line.ends_with("… (a message of 4062 bytes, cut)"), "{line}");
}

#[test]
fn a_quote_in_a_unit_name_leaves_the_messages_quotes_paired() {
    check(
        &format!(
            r#"{{"version": 1, "resources": [{{"type": "service", "id": "web.svc", "unit": "q\"{}", "state": "running"}}]}}"#,
            "u".repeat(300)
        ),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.svc"), field `unit`: "q\"uuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuu…" (303 bytes) is not a unit name: give its suffix, such as "q\"uuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuu…" (311 bytes)"#]],
    );
}

/// Past the first hundred, problems are counted rather than kept: five million bad resources
/// used to take 2 GB and 309 MB of text. Across the two halves of a large declaration, the
/// first hundred are still the first in order.
#[test]
fn problems_past_the_first_hundred_are_counted_not_listed() {
    let list = vec!["1"; 3000].join(",");
    let refused = Declaration::parse(format!(r#"{{"version": 1, "resources": [{list}]}}"#).as_bytes())
        .expect_err("refused");
    assert_eq!(refused.problems.len(), 100);
    assert_eq!(refused.unlisted, 2900);
    assert!(refused.problems.iter().enumerate().all(|(i, p)| p.index == Some(i)), "{refused}");
    let text = refused.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 102);
    expect![[r#"the declaration was refused (3000 problems); nothing on the machine was touched"#]]
        .assert_eq(lines[0]);
    expect![[r#"  resources[99]: a resource is an object, found a number"#]].assert_eq(lines[100]);
    expect![[r#"  … and 2900 more problems, not listed"#]].assert_eq(lines[101]);
}

// What serde_json refuses inside one value is placed by the value's path: its line and column
// are in the value's own text, not the document's, and were dropped.

#[test]
fn a_version_past_the_largest_number() {
    check(
        r#"{"version": 1e400, "resources": []}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              declaration, field `version`: number out of range"#]],
    );
}

#[test]
fn a_field_nested_past_the_recursion_limit() {
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    check(
        &format!(
            r#"{{"version": 1, "resources": [{{"type": "file", "id": "a.f", "path": "/a", "content": {deep}}}]}}"#
        ),
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "a.f"), field `content[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]…`: recursion limit exceeded"#]],
    );
}

#[test]
fn a_resource_with_a_bad_escape() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "a.f", "path": "/a", "content": "\ud800"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "a.f"), field `content`: unexpected end of hex escape"#]],
    );
}

#[test]
fn a_containers_holds_are_its_declared_host_ports_without_repeats() {
    let d = Declaration::parse(
        br#"{"version": 1, "resources": [
            {"type": "container", "id": "a.web", "name": "web", "image": "i:1",
             "ports": ["8080:80", "127.0.0.1:8000-8002:9000-9002/tcp", "127.0.0.1::53/udp", "[::1]:8080:80"]},
            {"type": "file", "id": "a.conf", "path": "/srv/a.conf", "content": "x"}
        ]}"#,
    )
    .unwrap();
    assert_eq!(
        d.resources[0].spec.holds(),
        vec![8000, 8001, 8002, 8080],
        "a port the runtime picks is not held"
    );
    assert!(d.resources[1].spec.holds().is_empty());
}

/// What a resource costs in the daemon for as long as it runs: at 100,000 of them each byte
/// here is 100 KB there (docs/memory.md). A field added to a file, or a type grown past a file
/// and not boxed, grows them all; this says so.
#[test]
fn a_resource_is_held_in_few_bytes() {
    use std::mem::size_of;
    assert!(size_of::<File>() <= 80, "a File is {} bytes", size_of::<File>());
    assert!(size_of::<Spec>() <= 80, "a Spec is {} bytes: box a type as large as a file", size_of::<Spec>());
    assert!(size_of::<Resource>() <= 136, "a Resource is {} bytes", size_of::<Resource>());
}

/// The lookup tables keep 32 bits of each hash: ids and paths that share one are all returned,
/// and the caller's comparison of the key picks the one asked for.
#[test]
fn a_lookup_table_returns_every_position_sharing_a_hash() {
    let t = table([(7u32, 3usize), (5, 1), (7, 2), (9, 0)].into_iter());
    assert_eq!(candidates(&t, 7).collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(candidates(&t, 5).collect::<Vec<_>>(), vec![1]);
    assert_eq!(candidates(&t, 6).count(), 0);
}

/// A record holds its resource's path itself, not a copy (docs/memory.md); names are copied.
#[test]
fn the_target_of_a_path_is_shared_and_of_a_name_is_not() {
    let d = Declaration::parse(
        br#"{"version": 1, "resources": [
            {"type": "file", "id": "a.conf", "path": "/etc/a.conf", "content": "x"},
            {"type": "package", "id": "a.pkg", "package": "curl"}]}"#,
    )
    .unwrap();
    let file = &d.resources[0].spec;
    assert!(std::sync::Arc::ptr_eq(&file.target_shared(), &file.target_shared()));
    assert_eq!(&*file.target_shared(), "/etc/a.conf");
    let pkg = &d.resources[1].spec;
    assert_eq!(&*pkg.target_shared(), "curl");
}
