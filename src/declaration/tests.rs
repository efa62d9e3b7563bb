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
              resources[0] (id "web.env"), field `mode`: invalid type: integer `644`, expected a string"#]],
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
          resources[0] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
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
fn secret_hole_without_a_secret() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "db.env", "path": "/etc/db.env",
            "content": "USER=app\nPASSWORD=${secret:db_password}\n", "secrets": {"db_user": "age1..."}}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.env"), field `content`: `${secret:db_password}` names a secret that `secrets` does not declare"#]],
    );
}

#[test]
fn secrets_without_content() {
    check(
        r#"{"version": 1, "resources": [{"type": "file", "id": "db.env", "path": "/etc/db.env",
            "bytes": "", "secrets": {"db_password": "age1..."}}]}"#,
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
              resources[0] (id "proxy.nginx"), field `reload-on[0]`: a resource cannot restart on itself"#]],
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
              resources[1] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
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
          resources[0] (id "proxy.http"), field `port`: invalid type: string "80", expected i64"#]],
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
              resources[0] (id "db.backup"), field `image`: "local/backup:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

#[test]
fn cron_with_six_fields() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "db.backup", "name": "db-backup", "image": "local/backup:1", "schedule": "0 0 3 * * *"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.backup"), field `image`: "local/backup:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

#[test]
fn run_once_with_schedule() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "db.backup", "name": "db-backup", "image": "local/backup:1", "run-once": true, "schedule": "0 3 * * *"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "db.backup"), field `image`: "local/backup:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

#[test]
fn bad_container_port_mapping() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "ports": ["8080:80", "8080:http"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

#[test]
fn bad_volume() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "volumes": ["/srv/web:data"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

#[test]
fn bad_hosts_entry() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "hosts": ["db:10.0.0.5", "cache"]}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

#[test]
fn env_name_with_equals() {
    check(
        r#"{"version": 1, "resources": [{"type": "container", "id": "web.app", "name": "web", "image": "local/web:1", "env": {"PORT=8080": ""}}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'"#]],
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
            the declaration was refused (2 problems); nothing on the machine was touched
              resources[0] (id "web.app"), field `image`: "local/web:1" is not a name: it must be non-empty, with no whitespace or '/'
              resources[1] (id "web.next"), field `image`: "local/web:2" is not a name: it must be non-empty, with no whitespace or '/'"#]],
    );
}

// Archives.

#[test]
fn archive_with_bytes_and_source() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static", "bytes": "", "source": "/var/cache/static.tar"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `bytes`: an archive has exactly one of `bytes` or `source`"#]],
    );
}

#[test]
fn archive_with_neither_bytes_nor_source() {
    check(
        r#"{"version": 1, "resources": [{"type": "archive", "id": "web.static", "path": "/srv/web/static"}]}"#,
        expect![[r#"
            the declaration was refused (1 problem); nothing on the machine was touched
              resources[0] (id "web.static"), field `bytes`: an archive has exactly one of `bytes` or `source`"#]],
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

// Several problems at once: every one is listed, in declaration order.

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
