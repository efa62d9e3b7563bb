//! What a container declares in its own grammars: published ports, volumes, hosts entries.

use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{pattern, AbsPath};

/// The transport of a published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP, the default.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Transport {
    /// The transport as the runtime spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Sctp => "sctp",
        }
    }
}

/// A container's published port, as `docker run --publish` takes it:
/// `[ip:][host port:]container port[/tcp|udp|sctp]`, the ip IPv6 in brackets. A host ip with
/// an empty host port (`127.0.0.1::80`) lets the runtime pick the port.
///
/// Kept with the text it was declared as, which is what a container's spec digest is of: the
/// same mapping written another way is another declaration, as it always was.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortMapping {
    text: Box<str>,
    host_ip: Option<std::net::IpAddr>,
    host_port: Option<u16>,
    container_port: u16,
    /// How many consecutive ports, from those above: 1, or the length of a range
    /// (`8000-8010:8000-8010` is 11).
    count: u16,
    transport: Transport,
}

/// The longest port range one mapping may publish. Each published port is a listener (and,
/// with Docker's userland proxy, a process) on the machine: a typo such as `1-65535` should be
/// refused, not take the runtime minutes to create (docs/decisions.md, "The schema").
pub const PORT_RANGE_LIMIT: u16 = 1000;

impl PortMapping {
    /// Reads `[ip:][host:]container[/tcp|udp|sctp]` (an IPv6 address in brackets), or says why it
    /// is not a port mapping.
    pub fn parse(s: &str) -> Result<PortMapping, String> {
        let bad = || format!("{s:?} is not a port mapping such as \"8080:80\" or \"127.0.0.1:8080:80/tcp\"");
        let (ports, transport) = match s.rsplit_once('/') {
            Some((ports, "tcp")) => (ports, Transport::Tcp),
            Some((ports, "udp")) => (ports, Transport::Udp),
            Some((ports, "sctp")) => (ports, Transport::Sctp),
            Some(_) => return Err(bad()),
            None => (s, Transport::Tcp),
        };
        let one = |p: &str| p.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(bad);
        // A port, or a range `a-b` (a <= b): its first port and how many.
        let port = |p: &str| -> Result<(u16, u16), String> {
            match p.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (one(a)?, one(b)?);
                    if a > b {
                        return Err(bad());
                    }
                    let count = b - a + 1;
                    if count > PORT_RANGE_LIMIT {
                        return Err(format!(
                            "{s:?} publishes {count} ports; a mapping publishes at most {PORT_RANGE_LIMIT}"
                        ));
                    }
                    Ok((a, count))
                }
                None => Ok((one(p)?, 1)),
            }
        };
        // The host address may be IPv6 in brackets, which itself holds colons.
        let (v6, rest) = match ports.strip_prefix('[') {
            Some(r) => {
                let (a, rest) = r.split_once("]:").ok_or_else(bad)?;
                let a: std::net::Ipv6Addr = a.parse().map_err(|_| bad())?;
                (Some(a), rest)
            }
            None => (None, ports),
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let (host_ip, host, (container_port, count)) = match (v6, parts.as_slice()) {
            (Some(a), [h, c]) => (Some(a.into()), Some(port(h)?), port(c)?),
            (None, [c]) => (None, None, port(c)?),
            (None, [h, c]) => (None, Some(port(h)?), port(c)?),
            (None, [ip, h, c]) => {
                let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| bad())?;
                let h = if h.is_empty() { None } else { Some(port(h)?) };
                (Some(ip.into()), h, port(c)?)
            }
            _ => return Err(bad()),
        };
        // Port for port: Docker's other reading of `8000-8010:80` (any one host port of the
        // range) publishes a port nobody can name in advance, so it is refused here
        // (docs/decisions.md, "The schema").
        if let Some((_, host_count)) = host {
            if host_count != count {
                return Err(format!(
                    "{s:?} maps {host_count} host ports to {count} container ports; give ranges of the same length"
                ));
            }
        }
        let host_port = host.map(|(first, _)| first);
        Ok(PortMapping { text: s.into(), host_ip, host_port, container_port, count, transport })
    }

    /// Each port it publishes, in order: (the port on the machine, `None` for one the runtime
    /// picks; the container's port). One pair for a single port, one per port of a range.
    pub fn publishes(&self) -> impl Iterator<Item = (Option<u16>, u16)> + '_ {
        (0..self.count).map(|i| (self.host_port.map(|h| h + i), self.container_port + i))
    }

    /// The mapping as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The address on the machine it is published on; `None` is every address.
    pub fn host_ip(&self) -> Option<std::net::IpAddr> {
        self.host_ip
    }

    /// The port on the machine (the first of a range); `None` lets the runtime pick one.
    pub fn host_port(&self) -> Option<u16> {
        self.host_port
    }

    /// The port inside the container.
    pub fn container_port(&self) -> u16 {
        self.container_port
    }

    /// The transport it is published for.
    pub fn transport(&self) -> Transport {
        self.transport
    }
}

text_serde!(PortMapping);
schema_of_a_pattern!(
    PortMapping,
    "PortMapping",
    {
        // A port or a range of them; that two ranges are the same length, and that a range is
        // neither backwards nor longer than `PORT_RANGE_LIMIT`, the parser alone checks.
        let port = &format!("{p}(-{p})?", p = pattern::PORT);
        let (v4, v6) = (pattern::IPV4, pattern::IPV6);
        format!(r"^({port}|{port}:{port}|{v4}:({port})?:{port}|\[{v6}\]:{port}:{port})(/(tcp|udp|sctp))?$")
    },
    "a published port or range: \"80\", \"8080:80\", \"8000-8010:8000-8010\", \"127.0.0.1:8080:80\", \"[::1]:8080:80\", each optionally /tcp, /udp or /sctp"
);

/// What a volume mounts: a path on the machine (bind-mounted) or a volume of the runtime's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VolumeSource {
    /// A path on the machine, bind-mounted.
    Path(AbsPath),
    /// A volume of the runtime's, by its name.
    Named(Box<str>),
}

impl fmt::Display for VolumeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VolumeSource::Path(p) => f.write_str(p.as_str()),
            VolumeSource::Named(n) => f.write_str(n),
        }
    }
}

/// A container's volume, as `docker run --volume` takes it: `source:target[:options]`, the
/// source an absolute path on the machine or the name of a volume (no '/'), the target an
/// absolute path in the container.
///
/// Kept with the text it was declared as, which is what a container's spec digest is of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Volume {
    text: Box<str>,
    source: VolumeSource,
    target: Box<str>,
    options: Option<Box<str>>,
}

impl Volume {
    /// Reads `source:target[:options]`, or says why it is not a volume.
    pub fn parse(s: &str) -> Result<Volume, String> {
        let bad = || format!("{s:?} is not a volume such as \"/srv/data:/data\" or \"name:/data:ro\"");
        let (source, target, options) = match s.split(':').collect::<Vec<&str>>().as_slice() {
            [source, target] => (*source, *target, None),
            [source, target, options] => (*source, *target, Some(*options)),
            _ => return Err(bad()),
        };
        if source.is_empty() || !target.starts_with('/') {
            return Err(bad());
        }
        // A source with a '/' is a path, and then it must be one the host would name so; one
        // without is a volume's name.
        let source = if source.contains('/') {
            VolumeSource::Path(AbsPath::parse(source).map_err(|_| bad())?)
        } else {
            VolumeSource::Named(source.into())
        };
        Ok(Volume { text: s.into(), source, target: target.into(), options: options.map(Into::into) })
    }

    /// The volume as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// What it mounts.
    pub fn source(&self) -> &VolumeSource {
        &self.source
    }

    /// The path on the machine it bind-mounts; `None` for a named volume.
    pub fn host_path(&self) -> Option<&AbsPath> {
        match &self.source {
            VolumeSource::Path(p) => Some(p),
            VolumeSource::Named(_) => None,
        }
    }

    /// Where it is mounted inside the container.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What follows the target (`ro`, `z`...), for the runtime to read.
    pub fn options(&self) -> Option<&str> {
        self.options.as_deref()
    }
}

text_serde!(Volume);
schema_of_a_pattern!(
    Volume,
    "Volume",
    format!(r"^([^:/]+|/|({})+/*):/[^:]*(:[^:]*)?$", pattern::segment(":")),
    "SOURCE:TARGET[:OPTIONS]: SOURCE a volume's name or an absolute path, TARGET absolute"
);

/// An entry of a container's own hosts file: `name:ip`, the ip IPv4 or IPv6 (`db6:fd00::5`),
/// or `host-gateway`, which the runtime (Docker 20.10 and later) resolves to the machine's
/// address on the container's bridge, as `docker run --add-host name:host-gateway` does.
///
/// Kept with the text it was declared as, which is what a container's spec digest is of, and
/// what the runtime is given (it is the runtime's own form).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostEntry {
    text: Box<str>,
    /// `None` for `host-gateway`.
    ip: Option<std::net::IpAddr>,
}

/// The word that stands for the machine's address as the container sees it.
pub const HOST_GATEWAY: &str = "host-gateway";

impl HostEntry {
    /// Reads "name:ip", or says why it is not a host entry.
    pub fn parse(s: &str) -> Result<HostEntry, String> {
        match s.split_once(':') {
            Some((name, HOST_GATEWAY)) if !name.is_empty() => Ok(HostEntry { text: s.into(), ip: None }),
            Some((name, ip)) if !name.is_empty() => match ip.parse() {
                Ok(ip) => Ok(HostEntry { text: s.into(), ip: Some(ip) }),
                Err(_) => Err(format!("{s:?} is not \"name:ip\" or \"name:host-gateway\"")),
            },
            _ => Err(format!("{s:?} is not \"name:ip\" or \"name:host-gateway\"")),
        }
    }

    /// The entry as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The host name it adds.
    pub fn name(&self) -> &str {
        self.text.split_once(':').map_or("", |(name, _)| name)
    }

    /// The address; `None` for `host-gateway`, which the runtime resolves.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.ip
    }
}

text_serde!(HostEntry);
schema_of_a_pattern!(
    HostEntry,
    "HostEntry",
    format!(r"^[^:]+:({}|{}|{HOST_GATEWAY})$", pattern::IPV4, pattern::IPV6),
    "NAME:IP or NAME:host-gateway, an entry of the container's /etc/hosts"
);

#[cfg(test)]
mod tests {
    use super::super::from_json;
    use super::*;

    #[test]
    fn a_port_mapping_reads_as_docker_run_publish_does() {
        let p = |s: &str| {
            let m = PortMapping::parse(s).unwrap();
            assert_eq!(m.as_str(), s, "the declared text is kept");
            (m.host_ip().map(|ip| ip.to_string()), m.host_port(), m.container_port(), m.transport().as_str())
        };
        assert_eq!(p("80"), (None, None, 80, "tcp"));
        assert_eq!(p("8080:80"), (None, Some(8080), 80, "tcp"));
        assert_eq!(p("127.0.0.1:8080:80/udp"), (Some("127.0.0.1".into()), Some(8080), 80, "udp"));
        assert_eq!(p("127.0.0.1::80"), (Some("127.0.0.1".into()), None, 80, "tcp"));
        assert_eq!(p("[::1]:8080:80"), (Some("::1".into()), Some(8080), 80, "tcp"));
        assert_eq!(p("[fd00::5]:53:53/sctp"), (Some("fd00::5".into()), Some(53), 53, "sctp"));
        // Ranges, as Docker takes them: port for port.
        let all = |s: &str| PortMapping::parse(s).unwrap().publishes().collect::<Vec<_>>();
        assert_eq!(all("8080:80"), [(Some(8080), 80)]);
        assert_eq!(all("8000-8002:9000-9002"), [(Some(8000), 9000), (Some(8001), 9001), (Some(8002), 9002)]);
        assert_eq!(all("127.0.0.1:8000-8001:8000-8001/udp"), [(Some(8000), 8000), (Some(8001), 8001)]);
        assert_eq!(all("5000-5001"), [(None, 5000), (None, 5001)]);
        assert_eq!(all("127.0.0.1::5000-5001"), [(None, 5000), (None, 5001)]);
        assert_eq!(all("65535-65535"), [(None, 65535)]);
        assert_eq!(
            PortMapping::parse("8000-8010:80").unwrap_err(),
            r#""8000-8010:80" maps 11 host ports to 1 container ports; give ranges of the same length"#
        );
        assert_eq!(
            PortMapping::parse("1-65535").unwrap_err(),
            r#""1-65535" publishes 65535 ports; a mapping publishes at most 1000"#
        );
    }

    #[test]
    fn a_port_mapping_out_of_its_grammar_is_refused_by_its_text() {
        for bad in [
            "",
            "http",
            "8080:http",
            "0",
            "8080:0",
            "65536",
            "80/icmp",
            "80/",
            "1:2:3:4",
            "localhost:8080:80",
            "::1:8080:80",
            "[::1]::80",
            "[::1]:80",
            "[127.0.0.1]:8080:80",
            "[::1:8080:80",
            "10.0.0.1:80",
            "8010-8000",
            "8000-:80",
            "-8000",
            "0-5",
        ] {
            assert_eq!(
                PortMapping::parse(bad).unwrap_err(),
                format!("{bad:?} is not a port mapping such as \"8080:80\" or \"127.0.0.1:8080:80/tcp\""),
            );
        }
        assert_eq!(from_json::<PortMapping>("\"8080:80\"").unwrap().to_string(), "8080:80");
        assert_eq!(
            from_json::<PortMapping>("\"80/icmp\"").unwrap_err(),
            r#""80/icmp" is not a port mapping such as "8080:80" or "127.0.0.1:8080:80/tcp""#
        );
    }

    #[test]
    fn a_volume_is_a_path_or_a_name_then_a_target() {
        let v = Volume::parse("/srv/web:/srv/web:ro").unwrap();
        assert_eq!(v.host_path().map(AbsPath::as_str), Some("/srv/web"));
        assert_eq!((v.target(), v.options(), v.as_str()), ("/srv/web", Some("ro"), "/srv/web:/srv/web:ro"));
        let v = Volume::parse("web-data:/data").unwrap();
        assert_eq!(v.source(), &VolumeSource::Named("web-data".into()));
        assert_eq!((v.host_path(), v.target(), v.options()), (None, "/data", None));
        // The source path is normalised as every declared path is; the text is kept.
        let v = Volume::parse("/srv/web/:/data").unwrap();
        assert_eq!(v.source().to_string(), "/srv/web");
        assert_eq!(v.to_string(), "/srv/web/:/data");
    }

    #[test]
    fn a_volume_out_of_its_grammar_is_refused_by_its_text() {
        for bad in [
            "",
            "/srv/web",
            "/srv/web:data",
            ":/data",
            "srv/web:/data",
            "/srv/../web:/data",
            "/srv//web:/data",
            "a:/b:ro:extra",
        ] {
            assert_eq!(
                Volume::parse(bad).unwrap_err(),
                format!("{bad:?} is not a volume such as \"/srv/data:/data\" or \"name:/data:ro\""),
            );
        }
        assert_eq!(
            from_json::<Volume>("\"/srv/web:data\"").unwrap_err(),
            r#""/srv/web:data" is not a volume such as "/srv/data:/data" or "name:/data:ro""#
        );
    }

    #[test]
    fn a_host_entry_is_a_name_and_an_address() {
        let h = HostEntry::parse("db:10.0.0.5").unwrap();
        assert_eq!((h.name(), h.ip(), h.as_str()), ("db", Some("10.0.0.5".parse().unwrap()), "db:10.0.0.5"));
        let h = HostEntry::parse("db6:fd00::5").unwrap();
        assert_eq!((h.name(), h.ip()), ("db6", Some("fd00::5".parse().unwrap())));
        let h = HostEntry::parse("host.docker.internal:host-gateway").unwrap();
        assert_eq!(
            (h.name(), h.ip(), h.as_str()),
            ("host.docker.internal", None, "host.docker.internal:host-gateway")
        );
        for bad in
            ["cache", ":10.0.0.5", "db:", "db:not-an-ip", "db:10.0.0.256", "db:Host-Gateway", ":host-gateway"]
        {
            assert_eq!(
                HostEntry::parse(bad).unwrap_err(),
                format!("{bad:?} is not \"name:ip\" or \"name:host-gateway\"")
            );
        }
        assert_eq!(
            from_json::<HostEntry>("\"cache\"").unwrap_err(),
            r#""cache" is not "name:ip" or "name:host-gateway""#
        );
    }
}
