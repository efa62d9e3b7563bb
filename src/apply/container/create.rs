//! Creating a container: everything the runtime is given, resolved (env-files read and parsed,
//! bind sources checked, ports and labels).

use std::collections::HashMap;

use crate::apply::{Error, Need};
use crate::declaration::{Container, Resource};
use crate::system::docker::{self, NewContainer, ID_LABEL, SPEC_LABEL, STEP_LABEL};

/// The most of an env-file the host reads: far more than any real one, and a bound on what a
/// file planted at the path (or `/dev/zero` behind a symlink) can cost.
const ENV_FILE_LIMIT: u64 = 16 << 20;

/// Everything the runtime needs to create the container, resolved: env-files read, bind
/// sources checked. The ports were parsed with the declaration.
pub(super) fn new_container(
    r: &Resource,
    c: &Container,
    want: &str,
    keep_running: bool,
) -> Result<NewContainer, Error> {
    let name = c.name.as_str();
    let mut env = Vec::new();
    // The Engine API takes no env-file: the docker CLI reads it on the client side, and so
    // does the host, in the CLI's format. Values are never logged (docs/containers.md,
    // "Creating, and reading back").
    for (i, path) in c.env_file.iter().enumerate() {
        let unusable = |why: String| Error::EnvFile {
            container: name.to_owned(),
            index: i,
            path: path.as_path().to_owned(),
            why,
        };
        let bytes = crate::system::input::read_input_file(path.as_path(), ENV_FILE_LIMIT)
            .map_err(|e| unusable(e.to_string()))?
            .ok_or_else(|| Error::Missing {
                path: path.as_path().to_owned(),
                need: Need::EnvFile { container: name.to_owned(), index: i },
            })?;
        env.extend(parse_env_file(&bytes).map_err(unusable)?);
    }
    env.extend(c.env.iter().map(|(k, v)| format!("{k}={v}")));

    let mut binds = Vec::new();
    for (i, v) in c.volumes.iter().enumerate() {
        // Docker makes a missing bind source as an empty directory, owned by root. Where a file
        // was meant (a credential not written yet) that directory then blocks the file for
        // ever, so a missing source is refused instead (docs/containers.md, "A bind-mount
        // source that does not exist is refused").
        if let Some(source) = v.host_path().filter(|p| !crate::system::input::exists(p.as_path())) {
            return Err(Error::Missing {
                path: source.as_path().to_owned(),
                need: Need::BindSource { container: name.to_owned(), index: i },
            });
        }
        // Given in the runtime's own form, from the parts: the source is the path that was
        // just checked, not text cut from the declaration again.
        let mut bind = format!("{}:{}", v.source(), v.target());
        if let Some(options) = v.options() {
            bind.push(':');
            bind.push_str(options);
        }
        binds.push(bind);
    }

    // A step publishes nothing: it runs beside the service it prepares, which holds those
    // ports, and a run-once step or a fire would otherwise fail on them (or, before the
    // service is up, expose a migration to the network for as long as it runs). A step that
    // declares ports (a template shared with its service) is told so in its outcome
    // (docs/containers.md, "A step publishes no ports").
    let published = if keep_running { &c.ports[..] } else { &[] };
    let ports = published
        .iter()
        .flat_map(|p| {
            p.publishes().map(|(host_port, container_port)| docker::Publish {
                container_port,
                transport: p.transport().as_str(),
                host_ip: p.host_ip(),
                host_port,
            })
        })
        .collect();

    let mut labels =
        HashMap::from([(SPEC_LABEL.to_owned(), want.to_owned()), (ID_LABEL.to_owned(), r.id.to_string())]);
    // A step's container exits by design. Marked, so the event watcher does not take its end
    // for drift: a failed run-once step would otherwise be run again at every exit of its own
    // (docs/containers.md, "The event watcher (`watchers::docker`)").
    if !keep_running {
        let kind = if c.schedule.is_some() { "scheduled" } else { "run-once" };
        labels.insert(STEP_LABEL.to_owned(), kind.to_owned());
    }
    Ok(NewContainer {
        name: name.to_owned(),
        image: c.image.as_str().to_owned(),
        env,
        args: c.args.clone(),
        labels,
        binds,
        ports,
        network: c.network.as_ref().map(|n| n.as_str().to_owned()),
        hosts: c.hosts.iter().map(|h| h.as_str().to_owned()).collect(),
        keep_running,
    })
}

/// Parses an env-file the way the docker CLI does: `KEY=VALUE` lines, the value taken as
/// written; blank lines and `#` comments skipped. A bare `KEY`, which the CLI fills from its
/// own environment, is skipped: the agent's environment is not the container's.
pub fn parse_env_file(bytes: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_owned())?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, _)) = line.split_once('=') else { continue };
        if key.is_empty() || key.contains(char::is_whitespace) {
            // The line number, never the line: it may hold a secret.
            return Err(format!("line {} does not start with a variable name", n + 1));
        }
        out.push(line.to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::{Declaration, Spec};

    #[test]
    fn env_files_parse_like_the_docker_cli() {
        let got = parse_env_file(b"# a comment\n\nPORT=8080\n  NAME=a b \nBARE\nEMPTY=\n").unwrap();
        assert_eq!(got, vec!["PORT=8080", "NAME=a b ", "EMPTY="]);
        let err = parse_env_file(b"OK=1\nA B=secret\n").unwrap_err();
        assert_eq!(err, "line 2 does not start with a variable name");
        assert!(!err.contains("secret"));
    }

    #[test]
    fn the_runtime_is_given_the_parsed_ports_binds_and_hosts() {
        let d = Declaration::parse(
            br#"{"version": 1, "resources": [
                {"type": "container", "id": "web.app", "name": "web", "image": "local/web:1",
                 "ports": ["80", "127.0.0.1::8080", "[::1]:8443:443/tcp", "5353:53/udp"],
                 "volumes": ["/tmp/:/scratch:ro", "web-data:/data"], "hosts": ["db:10.0.0.5"]}]}"#,
        )
        .unwrap();
        let r = &d.resources[0];
        let Spec::Container(c) = &r.spec else { unreachable!() };
        let new = new_container(r, c, "sha256:want", true).unwrap();
        let publish = |container_port, transport, host_ip: Option<&str>, host_port| docker::Publish {
            container_port,
            transport,
            host_ip: host_ip.map(|ip| ip.parse().unwrap()),
            host_port,
        };
        assert_eq!(
            new.ports,
            [
                publish(80, "tcp", None, None),
                publish(8080, "tcp", Some("127.0.0.1"), None),
                publish(443, "tcp", Some("::1"), Some(8443)),
                publish(53, "udp", None, Some(5353)),
            ]
        );
        // The source as checked (normalised), in the runtime's own form.
        assert_eq!(new.binds, ["/tmp:/scratch:ro", "web-data:/data"]);
        assert_eq!(new.hosts, ["db:10.0.0.5"]);
        // A step publishes none of them: it runs beside the service that holds them.
        let step = new_container(r, c, "sha256:want", false).unwrap();
        assert!(step.ports.is_empty());
        assert_eq!(step.binds, new.binds);
    }
}
