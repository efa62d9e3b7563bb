//! The container runtime: the Docker Engine API through bollard, spoken to Docker itself or to
//! Podman's Docker-compatible socket.
//!
//! Every call here blocks. Its callers (the appliers, the action applier, a scheduled run) run
//! on a blocking thread of a tokio runtime, and blocking on the runtime's handle keeps their
//! ordering plain: one request at a time, in the order the declaration asks. An async caller
//! uses `tokio::task::spawn_blocking`.
//!
//! Architecture Invariant: this module knows the runtime's API and nothing of declarations. It
//! says what is there and does what it is asked; deciding is the appliers'.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bollard::errors::Error as Bollard;
use bollard::models::{
    ContainerCreateBody, HostConfig, NetworkCreateRequest, PortBinding, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectContainerOptions, InspectNetworkOptions,
    RemoveContainerOptionsBuilder, StartContainerOptions, StopContainerOptions, WaitContainerOptionsBuilder,
};
use futures_util::StreamExt as _;

/// The label holding the digest of the spec a container was created from.
pub const SPEC_LABEL: &str = "mesh-host.spec";
/// The labels the watcher reads (the id of the resource that declared a container or network;
/// a step's mark) and the sockets both look in: defined once, in the watchers crate.
pub use mesh_host_watchers::docker::{DEFAULT_SOCKETS, ID_LABEL, STEP_LABEL};

/// Why the runtime could not do something.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No socket of the ones looked in answers.
    #[error("no container runtime answers on this machine (tried {tried}); start Docker or Podman's service, or configure its socket")]
    NoRuntime {
        /// The sockets tried, as a list for a person.
        tried: String,
    },
    /// The socket the configuration names does not answer; the default ones are not tried.
    #[error("the configured container runtime socket {socket} does not answer: {reason}")]
    Configured {
        /// The configured socket.
        socket: String,
        /// Why it does not answer.
        reason: String,
    },
    /// The runtime answered a call with an error.
    #[error("{what}: {}", api_message(.source))]
    Api {
        /// What the host was doing, as the message's start ("cannot start container web").
        what: String,
        /// The client's error, holding the runtime's answer.
        #[source]
        source: Bollard,
    },
    /// A call that did not finish within its limit.
    #[error("{what} did not finish within {}; {left}", crate::system::human(*limit))]
    TimedOut {
        /// What the host was doing.
        what: String,
        /// How long it was given.
        limit: std::time::Duration,
        /// What is left behind, as a person must know it.
        left: &'static str,
    },
    /// Anything else, in words.
    #[error("{0}")]
    Other(String),
}

/// The engine's own words for an error it answered with, without bollard's wrapping.
fn api_message(e: &Bollard) -> String {
    match e {
        Bollard::DockerResponseServerError { status_code, message } => {
            format!("the runtime answered {status_code}: {}", message.trim())
        }
        other => other.to_string(),
    }
}

/// What the runtime holds of an image: its id, and the repository digests
/// (`repo@sha256:...`) it is known by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageFound {
    /// The image's id (`sha256:...`).
    pub id: String,
    /// The repository digests it is known by (`repo@sha256:...`).
    pub repo_digests: Vec<String>,
}

/// The registry an image is pulled from, as the Docker client names it in its configuration:
/// the first part of the name when it is a host (it holds a '.' or a ':', or is `localhost`),
/// else Docker Hub.
fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// What the Docker client (`docker login`) stored for the image's registry, sent with the pull
/// as the CLI sends it: Docker's engine keeps no credentials of its own, its client passes them
/// with each pull. Read from `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`
/// (`/root` without a HOME), looked up as the CLI does: the registry's own credential helper
/// (`credHelpers`), else the one for every registry (`credsStore`), each run as
/// `docker-credential-NAME get`; else the `auths` entry. `Ok(None)` when there is nothing for
/// that registry (a helper that has no login for it says so); a config that cannot be read is
/// said in the log, never its content. A helper that cannot be run, or fails, is the error:
/// the pull is not tried without the login it keeps.
fn registry_credentials(
    image: &str,
) -> std::result::Result<Option<bollard::auth::DockerCredentials>, String> {
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => std::path::PathBuf::from(dir).join("config.json"),
        // A system service may run without HOME; the agent runs as root, whose home it is.
        None => std::env::var_os("HOME")
            .map_or_else(|| std::path::PathBuf::from("/root"), std::path::PathBuf::from)
            .join(".docker/config.json"),
    };
    let bytes = match crate::system::read_input(&path, 1 << 20) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            tracing::warn!(config = %path.display(), error = %e, "cannot read the container client's configuration; pulling without credentials");
            return Ok(None);
        }
    };
    let Ok(config) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        tracing::warn!(config = %path.display(), "the container client's configuration is not JSON; pulling without credentials");
        return Ok(None);
    };
    let registry = registry_of(image);
    match helper_for(&config, registry) {
        Some(helper) => from_helper(helper, registry),
        None => Ok(credentials_in(&config, registry)),
    }
}

/// The credential helper the Docker CLI would ask for `registry`: its `credHelpers` entry, else
/// `credsStore`. An empty name is none.
fn helper_for<'a>(config: &'a serde_json::Value, registry: &str) -> Option<&'a str> {
    let own = config.get("credHelpers").and_then(|h| h.as_object()).and_then(|helpers| {
        helpers.iter().find(|(key, _)| registry_host(key) == registry).and_then(|(_, name)| name.as_str())
    });
    own.or_else(|| config.get("credsStore").and_then(|s| s.as_str())).filter(|name| !name.is_empty())
}

/// How long a credential helper may take: it may ask a keychain or a cloud's token service,
/// but it runs inside a pass, which it must not hold for ever.
const HELPER_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `docker-credential-NAME get` with the registry's address on its standard input, as the
/// Docker CLI does (Docker Hub's is `https://index.docker.io/v1/`), and reads its answer
/// (`{"ServerURL", "Username", "Secret"}`; a `Username` of `<token>` makes the secret an
/// identity token). "credentials not found" is no login; any other failure is the error,
/// naming the helper and never what it printed on success.
fn from_helper(
    helper: &str,
    registry: &str,
) -> std::result::Result<Option<bollard::auth::DockerCredentials>, String> {
    let program = format!("docker-credential-{helper}");
    let server = if registry == "docker.io" { "https://index.docker.io/v1/" } else { registry };
    let ran =
        crate::system::command::run_fed_within(&[&program, "get"], server.as_bytes().to_vec(), HELPER_LIMIT)
            .map_err(|e| format!("cannot get the login for {registry} from the credential helper: {e}"))?;
    if !ran.success() {
        if ran.stdout.contains("credentials not found") || ran.stderr.contains("credentials not found") {
            return Ok(None);
        }
        return Err(format!(
            "the credential helper {program} has no login for {registry}: it {}",
            ran.describe()
        ));
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        username: String,
        secret: String,
    }
    let answer: Answer = serde_json::from_str(&ran.stdout).map_err(|e| {
        format!(
            "the credential helper {program} answered for {registry} with something other than its JSON: {e}"
        )
    })?;
    let mut credentials =
        bollard::auth::DockerCredentials { serveraddress: Some(server.to_owned()), ..Default::default() };
    if answer.username == "<token>" {
        credentials.identitytoken = Some(answer.secret);
    } else {
        credentials.username = Some(answer.username);
        credentials.password = Some(answer.secret);
    }
    Ok(Some(credentials))
}

/// A registry as a key of the client's configuration names it, reduced to the host the image
/// names (`https://index.docker.io/v1/` is Docker Hub's).
fn registry_host(key: &str) -> String {
    let key = key.trim_start_matches("https://").trim_start_matches("http://");
    let key = key.split('/').next().unwrap_or(key);
    if key == "index.docker.io" || key == "registry-1.docker.io" {
        "docker.io".to_owned()
    } else {
        key.to_owned()
    }
}

/// The `auths` entry of a Docker client configuration for a registry. Its keys may be written
/// with a scheme and a path (`https://index.docker.io/v1/` is Docker Hub's).
fn credentials_in(config: &serde_json::Value, registry: &str) -> Option<bollard::auth::DockerCredentials> {
    use base64::Engine as _;
    let auths = config.get("auths")?.as_object()?;
    let (key, entry) = auths.iter().find(|(key, _)| registry_host(key) == registry)?;
    if let Some(token) = entry.get("identitytoken").and_then(|t| t.as_str()) {
        return Some(bollard::auth::DockerCredentials {
            identitytoken: Some(token.to_owned()),
            serveraddress: Some(key.clone()),
            ..Default::default()
        });
    }
    let auth = entry.get("auth")?.as_str()?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(auth).ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(bollard::auth::DockerCredentials {
        username: Some(user.to_owned()),
        password: Some(password.to_owned()),
        serveraddress: Some(key.clone()),
        ..Default::default()
    })
}

/// An image reference as the Engine API's pull takes it: the repository, and the tag or digest
/// apart. Given no tag, the API would pull every tag of the repository, so `latest` is said, as
/// the CLI does.
fn pull_parts(image: &str) -> (&str, &str) {
    if let Some((repo, digest)) = image.split_once('@') {
        return (repo, digest);
    }
    // A ':' after the last '/' is a tag's; one before it is a registry's port.
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].rfind(':') {
        Some(i) => (&image[..name_start + i], &image[name_start + i + 1..]),
        None => (image, "latest"),
    }
}

fn is_not_found(e: &Bollard) -> bool {
    matches!(e, Bollard::DockerResponseServerError { status_code: 404, .. })
}

type Result<T> = std::result::Result<T, Error>;

/// What is known about a container, read fresh from the runtime.
#[derive(Clone, Debug, Default)]
pub struct ContainerState {
    /// The container's id.
    pub id: String,
    /// Its name, without the leading `/` the engine gives it.
    pub name: String,
    /// Whether it is running now.
    pub running: bool,
    /// The code it exited with, once it has exited.
    pub exit_code: Option<i64>,
    /// The runtime's own status word: created, running, exited, dead...
    pub status: String,
    /// How many times the runtime restarted it by its restart policy. A container that exits
    /// at once under `unless-stopped` is restarted within milliseconds and may look running
    /// when looked at; this count is what gives it away.
    pub restarts: i64,
    /// Its labels, the host's `mesh-host.*` among them.
    pub labels: HashMap<String, String>,
}

impl ContainerState {
    /// The value of one label, if the container has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// What to create. Everything is already resolved: env-files are read, ports are parsed.
#[derive(Clone, Debug, Default)]
pub struct NewContainer {
    /// The container's name.
    pub name: String,
    /// The image, by name or digest.
    pub image: String,
    /// `KEY=VALUE` entries, in the order given; a later one wins.
    pub env: Vec<String>,
    /// Arguments given to the image's entrypoint (Docker's `Cmd`); empty keeps the image's.
    pub args: Vec<String>,
    /// Labels to put on it, the resource's id and the spec's digest among them.
    pub labels: HashMap<String, String>,
    /// `source:destination[:options]`, as `docker run -v` takes them.
    pub binds: Vec<String>,
    /// Ports to publish.
    pub ports: Vec<Publish>,
    /// The network to join; the runtime's default when absent.
    pub network: Option<String>,
    /// `name:ip` entries for the container's own hosts file.
    pub hosts: Vec<String>,
    /// Restarted by the runtime itself when it exits or the machine boots (a long-running
    /// container); a step is never restarted.
    pub keep_running: bool,
}

/// A port published from a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Publish {
    /// The port inside the container.
    pub container_port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub transport: &'static str,
    /// `None` publishes on every address.
    pub host_ip: Option<std::net::IpAddr>,
    /// `None` lets the runtime pick the port.
    pub host_port: Option<u16>,
}

/// What a command run inside a container did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// The command's exit code.
    pub code: i64,
    /// Its standard output and error, interleaved as they came, cut at [`OUTPUT_LIMIT`].
    pub output: String,
}

/// Seconds a container is given to stop on SIGTERM before it is killed: Docker's own default.
pub const STOP_TIMEOUT: i32 = 10;

impl From<ExecOutput> for super::command::Ran {
    /// A command run inside a container, as one run on the machine would be reported: both of
    /// its streams, interleaved as they came, stand as its standard output.
    fn from(e: ExecOutput) -> Self {
        super::command::Ran {
            code: Some(i32::try_from(e.code).unwrap_or(i32::MAX)),
            stdout: e.output,
            stderr: String::new(),
        }
    }
}

/// At most this much of a command's output is kept: enough to say what went wrong, bounded so
/// that a chatty command cannot fill the agent's memory.
pub const OUTPUT_LIMIT: usize = 64 * 1024;

/// A connected runtime.
#[derive(Clone, Debug)]
pub struct Docker {
    client: bollard::Docker,
    socket: String,
    /// Whether it is Podman, asked only when a message needs the runtime's name.
    podman: Arc<OnceLock<bool>>,
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Handle::current().block_on(f)
}

/// A Podman container's name, from its id, asked of the `podman` program (Podman needs no
/// service, so there may be no socket to ask): `None` when Podman is not installed, does not
/// know the id, or does not answer within two seconds.
pub fn podman_name(id: &str) -> Option<String> {
    if !crate::system::command::exists("podman") || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let argv: Vec<String> =
        ["podman", "container", "inspect", "--format", "{{.Name}}", id].map(str::to_owned).into();
    let ran = crate::system::command::run_within(&argv, &[], Some(Duration::from_secs(2))).ok()?;
    let name = ran.stdout.trim();
    (ran.success() && !name.is_empty() && !name.contains('\n')).then(|| name.to_owned())
}

/// Connects to the runtime: the configured socket if there is one, else the first of
/// `DOCKER_HOST` and [`DEFAULT_SOCKETS`] that answers. The API version is settled with the
/// engine (API 1.41, or the engine's own when older): bollard would otherwise ask for a newer
/// one than Debian's engine speaks.
pub fn connect(configured: Option<&str>) -> Result<Docker> {
    block(connect_async(configured))
}

/// [`connect`], for an async caller.
pub async fn connect_async(configured: Option<&str>) -> Result<Docker> {
    if let Some(socket) = configured {
        return try_socket(socket)
            .await
            .map_err(|reason| Error::Configured { socket: socket.to_owned(), reason });
    }
    let mut tried = Vec::new();
    let from_env = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty());
    for socket in from_env.iter().map(String::as_str).chain(DEFAULT_SOCKETS) {
        match try_socket(socket).await {
            Ok(docker) => return Ok(docker),
            Err(reason) => tried.push(format!("{socket}: {reason}")),
        }
    }
    Err(Error::NoRuntime { tried: tried.join("; ") })
}

/// The Engine API version mesh-host speaks: Debian 12's engine (20.10) speaks 1.41, Podman 4's
/// compatible API answers to it, and nothing newer is needed.
const API: bollard::ClientVersion = bollard::ClientVersion { major_version: 1, minor_version: 41 };

async fn try_socket(socket: &str) -> std::result::Result<Docker, String> {
    let address = if socket.contains("://") { socket.to_owned() } else { format!("unix://{socket}") };
    let client = if let Some(path) = address.strip_prefix("unix://") {
        if !Path::new(path).exists() {
            return Err("no socket there".into());
        }
        bollard::Docker::connect_with_unix(&address, 120, &API)
    } else {
        bollard::Docker::connect_with_http(&address, 120, &API)
    }
    .map_err(|e| e.to_string())?;
    // A ping, asked at 1.41, is the whole probe: an engine that speaks 1.41 or newer answers in
    // well under a millisecond. `/version` would settle the same, but Podman takes 400 ms to
    // answer it, and a pass pays its probe once (a killed container's recovery is one pass).
    // Only an older engine refuses, and bollard's own negotiation settles on its version. A
    // short timeout: a socket whose server hangs must not hold the apply for two minutes.
    let probe = Duration::from_secs(10);
    let client = match tokio::time::timeout(probe, client.ping()).await {
        Ok(Ok(_)) => client,
        Ok(Err(Bollard::DockerResponseServerError { status_code: 400, .. })) => {
            match tokio::time::timeout(probe, client.negotiate_version()).await {
                Ok(Ok(older)) => older,
                Ok(Err(e)) => return Err(api_message(&e)),
                Err(_) => return Err("no answer within 10 s".into()),
            }
        }
        Ok(Err(e)) => return Err(api_message(&e)),
        Err(_) => return Err("no answer within 10 s".into()),
    };
    Ok(Docker { client, socket: address, podman: Arc::new(OnceLock::new()) })
}

impl Docker {
    /// The socket this client speaks to.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Whether the runtime is Podman (through its Docker-compatible API). Asks the runtime the
    /// first time; a runtime that does not say is taken to be Docker.
    pub fn is_podman(&self) -> bool {
        *self.podman.get_or_init(|| {
            block(self.client.version()).is_ok_and(|v| {
                v.components
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.name.to_ascii_lowercase().contains("podman"))
            })
        })
    }

    /// The runtime's name, for messages: `docker` or `podman`.
    pub fn cli(&self) -> &'static str {
        if self.is_podman() {
            "podman"
        } else {
            "docker"
        }
    }

    /// The container of this name, or `None` when there is none.
    pub fn container(&self, name: &str) -> Result<Option<ContainerState>> {
        let found = block(self.client.inspect_container(name, None::<InspectContainerOptions>));
        match found {
            Ok(c) => {
                let state = c.state.unwrap_or_default();
                Ok(Some(ContainerState {
                    id: c.id.unwrap_or_default(),
                    name: c.name.unwrap_or_default().trim_start_matches('/').to_owned(),
                    running: state.running.unwrap_or(false) && !state.restarting.unwrap_or(false),
                    restarts: c.restart_count.unwrap_or(0),
                    exit_code: state.exit_code,
                    status: state.status.map(|s| s.to_string()).unwrap_or_default(),
                    labels: c.config.and_then(|c| c.labels).unwrap_or_default(),
                }))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(Error::Api { what: format!("cannot inspect container {name}"), source }),
        }
    }

    /// The image as the runtime holds it, or `None` when it is not on this machine.
    pub fn image(&self, image: &str) -> Result<Option<ImageFound>> {
        match block(self.client.inspect_image(image)) {
            Ok(i) => Ok(Some(ImageFound {
                id: i.id.unwrap_or_default(),
                repo_digests: i.repo_digests.unwrap_or_default(),
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(Error::Api { what: format!("cannot inspect image {image}"), source }),
        }
    }

    /// Pulls the image through the runtime, which applies its own registry configuration (and,
    /// for Podman, its own credentials). The error is the registry's answer as the runtime
    /// relays it, for the person who must fix the name, the registry or the network.
    pub fn pull(&self, image: &str) -> std::result::Result<(), String> {
        let (from, tag) = pull_parts(image);
        let options = CreateImageOptionsBuilder::new().from_image(from).tag(tag).build();
        let credentials = registry_credentials(image)?;
        let pulled = block(async {
            let mut progress = self.client.create_image(Some(options), None, credentials);
            // The stream is the pull's progress; it ends when the pull does, and an error in it
            // is the pull's failure.
            while let Some(item) = progress.next().await {
                item?;
            }
            Ok::<(), Bollard>(())
        });
        pulled.map_err(|e| match e {
            Bollard::DockerStreamError { error } => error.trim().to_owned(),
            other => api_message(&other),
        })
    }

    /// Creates a container, not started.
    pub fn create(&self, c: &NewContainer) -> Result<String> {
        let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        for p in &c.ports {
            let binding = PortBinding {
                host_ip: p.host_ip.map(|ip| ip.to_string()),
                host_port: p.host_port.map(|port| port.to_string()),
            };
            port_bindings
                .entry(format!("{}/{}", p.container_port, p.transport))
                .or_insert_with(|| Some(Vec::new()))
                .get_or_insert_default()
                .push(binding);
        }
        let exposed: Vec<String> = port_bindings.keys().cloned().collect();
        let body = ContainerCreateBody {
            image: Some(c.image.clone()),
            env: (!c.env.is_empty()).then(|| c.env.clone()),
            cmd: (!c.args.is_empty()).then(|| c.args.clone()),
            labels: Some(c.labels.clone()),
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            host_config: Some(HostConfig {
                binds: (!c.binds.is_empty()).then(|| c.binds.clone()),
                port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
                network_mode: c.network.clone(),
                extra_hosts: (!c.hosts.is_empty()).then(|| c.hosts.clone()),
                restart_policy: Some(RestartPolicy {
                    name: Some(if c.keep_running {
                        RestartPolicyNameEnum::UNLESS_STOPPED
                    } else {
                        RestartPolicyNameEnum::NO
                    }),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new().name(&c.name).build();
        block(self.client.create_container(Some(options), body))
            .map(|r| r.id)
            .map_err(|source| Error::Api { what: format!("cannot create container {}", c.name), source })
    }

    /// Starts a container; one already running is fine.
    pub fn start(&self, name: &str) -> Result<()> {
        match block(self.client.start_container(name, None::<StartContainerOptions>)) {
            Ok(()) => Ok(()),
            // Already running: its restart policy, or another reconcile, was first.
            Err(Bollard::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(source) => Err(Error::Api { what: format!("cannot start container {name}"), source }),
        }
    }

    /// Stops a container (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]) and removes it. A
    /// container already gone is fine: absence is what removal is for.
    ///
    /// Stopped first rather than removed by force, which kills at once: a database being
    /// replaced deserves its clean shutdown. Podman's forced removal waits out the same
    /// timeout anyway.
    pub fn remove(&self, name: &str) -> Result<()> {
        let stop = StopContainerOptions { t: Some(STOP_TIMEOUT), signal: None };
        // Not running, or not there: either way the removal below settles it, and reads back.
        let _ = block(self.client.stop_container(name, Some(stop)));
        let options = RemoveContainerOptionsBuilder::new().force(true).build();
        match block(self.client.remove_container(name, Some(options))) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(Error::Api { what: format!("cannot remove container {name}"), source }),
        }
    }

    /// Waits for a started container to exit and returns its exit code. With a limit, a
    /// container still running when it passes is stopped (SIGTERM, then SIGKILL after
    /// [`STOP_TIMEOUT`]) and left in place for its logs, and the error says so.
    pub fn wait(&self, name: &str, limit: Option<std::time::Duration>) -> Result<i64> {
        let options = WaitContainerOptionsBuilder::new().condition("not-running").build();
        let mut stream = self.client.wait_container(name, Some(options));
        let next = match limit {
            None => block(stream.next()),
            Some(limit) => match block(tokio::time::timeout(limit, stream.next())) {
                Ok(next) => next,
                Err(_) => {
                    let stop = StopContainerOptions { t: Some(STOP_TIMEOUT), signal: None };
                    let _ = block(self.client.stop_container(name, Some(stop)));
                    return Err(Error::TimedOut {
                        what: format!("container {name}"),
                        limit,
                        left: "it was stopped, and is left for its logs",
                    });
                }
            },
        };
        match next {
            Some(Ok(r)) => Ok(r.status_code),
            // bollard turns a non-zero exit into an error carrying the code.
            Some(Err(Bollard::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(source)) => {
                Err(Error::Api { what: format!("waiting for container {name} to exit"), source })
            }
            None => Err(Error::Other(format!(
                "the runtime ended the wait for container {name} without an exit code"
            ))),
        }
    }

    /// Runs a command inside a running container and returns its exit code and output. With a
    /// limit, the wait for it ends when the limit passes; the runtime's API cannot kill what an
    /// exec started, so the error says it may still be running.
    pub fn exec(
        &self,
        container: &str,
        argv: &[String],
        limit: Option<std::time::Duration>,
    ) -> Result<ExecOutput> {
        let run = self.exec_unlimited(container, argv);
        match limit {
            None => block(run),
            Some(limit) => block(tokio::time::timeout(limit, run)).unwrap_or_else(|_| {
                Err(Error::TimedOut {
                    what: format!("{} in container {container}", argv[0]),
                    limit,
                    left: "the runtime cannot stop it, so it may still be running in the container",
                })
            }),
        }
    }

    async fn exec_unlimited(&self, container: &str, argv: &[String]) -> Result<ExecOutput> {
        use bollard::exec::{CreateExecOptions, StartExecResults};
        let api = |what: &str| {
            let what = format!("{what} in container {container}");
            move |source| Error::Api { what, source }
        };
        let created = self
            .client
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(argv.to_vec()),
                    ..Default::default()
                },
            )
            .await
            .map_err(api("cannot run a command"))?;
        let mut output = Vec::new();
        match self.client.start_exec(&created.id, None).await.map_err(api("cannot start a command"))? {
            StartExecResults::Attached { output: mut stream, .. } => {
                while let Some(item) = stream.next().await {
                    let item = item.map_err(api("reading a command's output"))?;
                    if output.len() < OUTPUT_LIMIT {
                        output.extend_from_slice(&item.into_bytes());
                    }
                }
            }
            StartExecResults::Detached => {}
        }
        output.truncate(OUTPUT_LIMIT);
        let inspected =
            self.client.inspect_exec(&created.id).await.map_err(api("cannot read a command's exit code"))?;
        let code = inspected.exit_code.ok_or_else(|| {
            Error::Other(format!("a command in container {container} ended without an exit code"))
        })?;
        Ok(ExecOutput { code, output: String::from_utf8_lossy(&output).into_owned() })
    }

    /// The network of this name: `None` when there is none, else its labels and the names of
    /// the containers attached to it.
    pub fn network(&self, name: &str) -> Result<Option<NetworkState>> {
        match block(self.client.inspect_network(name, None::<InspectNetworkOptions>)) {
            Ok(n) => {
                let mut containers: Vec<String> = n
                    .containers
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(id, c)| c.name.filter(|n| !n.is_empty()).unwrap_or(id))
                    .collect();
                containers.sort();
                Ok(Some(NetworkState { labels: n.labels.unwrap_or_default(), containers }))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(Error::Api { what: format!("cannot inspect network {name}"), source }),
        }
    }

    /// Creates a network with these labels.
    pub fn create_network(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        let request =
            NetworkCreateRequest { name: name.to_owned(), labels: Some(labels), ..Default::default() };
        block(self.client.create_network(request))
            .map(|_| ())
            .map_err(|source| Error::Api { what: format!("cannot create network {name}"), source })
    }

    /// Removes a network; one already gone is fine.
    pub fn remove_network(&self, name: &str) -> Result<()> {
        match block(self.client.remove_network(name)) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(Error::Api { what: format!("cannot remove network {name}"), source }),
        }
    }
}

/// What is known about a network.
#[derive(Clone, Debug, Default)]
pub struct NetworkState {
    /// Its labels, the host's `mesh-host.id` among them.
    pub labels: HashMap<String, String>,
    /// The containers attached to it, by name.
    pub containers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_those_the_client_stored_for_the_images_registry() {
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(registry_of("team/web:1"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5057/team/web:1"), "127.0.0.1:5057");
        assert_eq!(registry_of("registry.example/web@sha256:ab"), "registry.example");
        assert_eq!(registry_of("localhost/web"), "localhost");
        let config = serde_json::json!({"auths": {
            "https://index.docker.io/v1/": {"auth": "aHViOmh1YnB3"},
            "127.0.0.1:5057": {"auth": "bWg6cHc="},
            "registry.example": {"identitytoken": "tok"},
        }, "credsStore": "desktop"});
        let got = |registry: &str| {
            credentials_in(&config, registry).map(|c| (c.username, c.password, c.identitytoken))
        };
        assert_eq!(got("127.0.0.1:5057"), Some((Some("mh".into()), Some("pw".into()), None)));
        assert_eq!(got("docker.io"), Some((Some("hub".into()), Some("hubpw".into()), None)));
        assert_eq!(got("registry.example"), Some((None, None, Some("tok".into()))));
        assert_eq!(got("127.0.0.1:5055"), None);
    }

    #[test]
    fn a_pull_names_the_repository_and_the_tag_or_digest_apart() {
        assert_eq!(pull_parts("busybox"), ("busybox", "latest"));
        assert_eq!(pull_parts("local/web:1"), ("local/web", "1"));
        assert_eq!(pull_parts("127.0.0.1:5055/team/web"), ("127.0.0.1:5055/team/web", "latest"));
        assert_eq!(pull_parts("127.0.0.1:5055/team/web:2.1"), ("127.0.0.1:5055/team/web", "2.1"));
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            pull_parts(&format!("127.0.0.1:5055/web@{digest}")),
            ("127.0.0.1:5055/web", digest.as_str())
        );
        // A tag and a digest both: the digest decides, as the runtimes do.
        assert_eq!(pull_parts(&format!("web:1@{digest}")), ("web:1", digest.as_str()));
    }
}
