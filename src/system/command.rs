//! Running a program: an argv, never a shell. Standard input is closed, so nothing can wait
//! for an answer that will never come; standard output and error are captured for the report.

use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A program that could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program could not be started: not found, not executable.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program's name.
        program: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The program ran past its limit and was killed, with every process it started.
    #[error("{program} did not finish within {}; it was killed, with what it started", crate::system::human(*limit))]
    TimedOut {
        /// The program's name.
        program: String,
        /// How long it was given.
        limit: Duration,
    },
}

/// How a program ended.
#[derive(Debug)]
pub struct Ran {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// What it wrote to standard output.
    pub stdout: String,
    /// What it wrote to standard error.
    pub stderr: String,
}

impl Ran {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// "exited 3: the last lines it wrote", for an error message.
    pub fn describe(&self) -> String {
        let how = match self.code {
            Some(c) => format!("exited {c}"),
            None => "was killed by a signal".to_owned(),
        };
        let said = if self.stderr.trim().is_empty() { &self.stdout } else { &self.stderr };
        match tail(said) {
            Some(t) => format!("{how}: {t}"),
            None => how,
        }
    }
}

/// The last few lines of what a program wrote, at most 400 characters: enough to say why, and
/// short enough for a report line.
fn tail(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return None;
    }
    let joined = lines[lines.len().saturating_sub(3)..].join(" / ");
    let chars: Vec<char> = joined.chars().collect();
    Some(if chars.len() > 400 {
        format!("...{}", chars[chars.len() - 400..].iter().collect::<String>())
    } else {
        joined
    })
}

/// Runs `argv` to completion with extra environment variables.
pub fn run(argv: &[String], env: &[(&str, &str)]) -> Result<Ran, Error> {
    run_within(argv, env, None)
}

/// Runs `argv` to completion, or until `limit` has passed: then the program and every process
/// it started in its process group are killed (SIGKILL), and the error says so. The program
/// runs in a process group of its own for that reason.
pub fn run_within(argv: &[String], env: &[(&str, &str)], limit: Option<Duration>) -> Result<Ran, Error> {
    let (program, args) = argv.split_first().expect("an argv is never empty: the declaration refuses it");
    #[allow(clippy::disallowed_methods, reason = "system/ is the one place programs are run")]
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().map_err(|source| Error::Spawn { program: program.clone(), source })?;
    let pid = child.id();
    // The wait (and the reading of both pipes) is on a thread of its own, so this one can give
    // up at the limit.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match limit {
        None => rx.recv().expect("the waiting thread sends once"),
        Some(limit) => match rx.recv_timeout(limit) {
            Ok(out) => out,
            Err(_) => {
                let group = nix::unistd::Pid::from_raw(pid as i32);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                // A process that left the group can keep the pipes open; the wait is not
                // held for it.
                let _ = rx.recv_timeout(Duration::from_secs(5));
                return Err(Error::TimedOut { program: program.clone(), limit });
            }
        },
    };
    let out = out.map_err(|source| Error::Spawn { program: program.clone(), source })?;
    Ok(Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `argv` to completion with `input` on its standard input (written from a thread of its
/// own, so a program that writes a lot before it reads cannot block on a full pipe).
pub fn run_fed(argv: &[&str], input: Vec<u8>) -> Result<Ran, Error> {
    fed(argv, input, Stdio::piped())
}

/// `run_fed`, killed with its process group once `limit` has passed (the error says so): for a
/// program the agent runs in the middle of a pass, such as a registry's credential helper,
/// which must not hold the pass for ever.
pub fn run_fed_within(argv: &[&str], input: Vec<u8>, limit: Duration) -> Result<Ran, Error> {
    let (child, _feeder) = spawn_fed(argv, input, Stdio::piped(), true)?;
    let program = argv[0];
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(limit) else {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = rx.recv_timeout(Duration::from_secs(5));
        return Err(Error::TimedOut { program: program.to_owned(), limit });
    };
    Ok(ran(out.map_err(|source| Error::Spawn { program: program.to_owned(), source })?))
}

/// Runs `argv` with `input` on its standard input, its standard output captured and its
/// standard error the caller's own: for a program that talks to the person at the terminal
/// while it works (`ssh-keygen -Y sign` asking for a passphrase on the terminal, or for a
/// touch of a FIDO key). It stays in the caller's process group, so the terminal is its too.
pub fn run_talking(argv: &[&str], input: &[u8]) -> Result<Ran, Error> {
    fed(argv, input.to_vec(), Stdio::inherit())
}

/// `run_fed` and `run_talking`: `input` fed from a thread, standard output captured, standard
/// error as `stderr` says (captured when piped, empty in `Ran` otherwise).
fn fed(argv: &[&str], input: Vec<u8>, stderr: Stdio) -> Result<Ran, Error> {
    let (child, feeder) = spawn_fed(argv, input, stderr, false)?;
    let out =
        child.wait_with_output().map_err(|source| Error::Spawn { program: argv[0].to_owned(), source })?;
    // A program that exits without reading all of its input breaks the pipe; what it said
    // about why is in its output, which is what the caller reports.
    let _ = feeder.join();
    Ok(ran(out))
}

/// `argv` started with its standard input fed `input` from a thread (returned) and its
/// standard output piped; in a process group of its own when `own_group`, so that it can be
/// killed with whatever it started.
fn spawn_fed(
    argv: &[&str],
    input: Vec<u8>,
    stderr: Stdio,
    own_group: bool,
) -> Result<(std::process::Child, std::thread::JoinHandle<std::io::Result<()>>), Error> {
    use std::io::Write as _;
    let (program, args) = argv.split_first().expect("an argv is never empty");
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(stderr);
    if own_group {
        command.process_group(0);
    }
    #[allow(clippy::disallowed_methods, reason = "system/ is the one place programs are run")]
    let mut child =
        command.spawn().map_err(|source| Error::Spawn { program: (*program).to_owned(), source })?;
    let mut stdin = child.stdin.take().expect("stdin was piped");
    Ok((child, std::thread::spawn(move || stdin.write_all(&input))))
}

/// What a program that ran said, as text.
fn ran(out: std::process::Output) -> Ran {
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs a program given as string slices.
pub fn run_str(argv: &[&str], env: &[(&str, &str)]) -> Result<Ran, Error> {
    let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
    run(&argv, env)
}

/// Whether a program of this name is on the PATH.
pub fn exists(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            let p = dir.join(program);
            std::fs::metadata(&p).is_ok_and(|m| m.is_file())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_described_by_its_last_words() {
        let ran = Ran { code: Some(3), stdout: "noise\n".into(), stderr: "one\n\ntwo\nthree\nfour\n".into() };
        assert_eq!(ran.describe(), "exited 3: two / three / four");
        let quiet = Ran { code: Some(1), stdout: String::new(), stderr: String::new() };
        assert_eq!(quiet.describe(), "exited 1");
        let killed = Ran { code: None, stdout: "last\n".into(), stderr: String::new() };
        assert_eq!(killed.describe(), "was killed by a signal: last");
        let long = Ran { code: Some(1), stdout: String::new(), stderr: "x".repeat(1000) };
        assert_eq!(long.describe().chars().count(), "exited 1: ...".len() + 400);
    }

    #[test]
    fn a_program_past_its_limit_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let argv: Vec<String> = ["sh", "-c", &script].iter().map(|s| s.to_string()).collect();
        let started = std::time::Instant::now();
        let err = run_within(&argv, &[], Some(Duration::from_millis(300))).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "gave up at the limit: {:?}", started.elapsed());
        assert_eq!(err.to_string(), "sh did not finish within 300 ms; it was killed, with what it started");
        let child: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // Killed with its group; reaped by init once its parent is gone.
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .map_or(true, |stat| stat.rsplit(") ").next().is_some_and(|rest| rest.starts_with('Z')))
        });
        assert!(gone, "the sleep it started was killed too");

        // Within the limit, the same as `run`.
        let quick: Vec<String> = ["sh", "-c", "echo hi"].iter().map(|s| s.to_string()).collect();
        let ran = run_within(&quick, &[], Some(Duration::from_secs(10))).unwrap();
        assert!(ran.success() && ran.stdout == "hi\n");
    }

    #[test]
    fn argv_is_not_a_shell() {
        let ran = run_str(&["echo", "$HOME; false"], &[("MESH_HOST_T", "1")]).unwrap();
        assert!(ran.success());
        assert_eq!(ran.stdout, "$HOME; false\n");
        let env = run_str(&["sh", "-c", "echo $MESH_HOST_T"], &[("MESH_HOST_T", "yes")]).unwrap();
        assert_eq!(env.stdout, "yes\n");
        assert!(matches!(run_str(&["/nonexistent/program"], &[]), Err(Error::Spawn { .. })));
    }
}
