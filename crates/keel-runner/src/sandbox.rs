//! The system calls that confine a runner. The only unsafe code in keel.
//!
//! Order matters, and [`confine_process`] runs while the runner is
//! single-threaded (unsharing a user namespace requires it):
//!
//! 1. `PR_SET_NO_NEW_PRIVS`: nothing the runner executes can gain
//!    privileges (set-uid binaries, file capabilities).
//! 2. A new user namespace, and, unless the policy allows the network, a new
//!    network namespace in the same call: it holds only a loopback device
//!    that is down, so every connection fails, loopback included. The
//!    runner is root of its user namespace, which owns nothing but that
//!    network namespace; it gains no power over the host.
//! 3. Resource limits: no core dumps, a cap on file size, and
//!    `RLIMIT_NPROC` (see below for when it binds).
//! 4. Landlock ([`ruleset`]), at the best ABI the kernel offers: the workspace, the
//!    policy's write folders and the scratch folder read-write; the policy's
//!    read folders and the system folders read-only; a few devices; nothing
//!    else. With the network off, TCP (and UDP, where the kernel can) is
//!    also refused by Landlock, and from ABI 6 the runner cannot signal
//!    processes outside its sandbox or reach abstract Unix sockets.
//!
//! Landlock binds a thread and the threads and processes it creates. The
//! runner's main thread only talks to keel and starts commands; the file
//! tools run on a worker thread that enforces the ruleset before it reads
//! its first request, and every command enforces it before it executes
//! (from [`run_init`], with the ruleset's descriptor handed down). The main
//! thread stays outside Landlock for one reason: a command's namespace
//! init must write that namespace's `pid_max`, which a Landlocked process
//! cannot, and only an unconfined ancestor can start such an init.
//!
//! Each command then runs through [`run_init`]: a small process that puts
//! the command in a new PID namespace, where it is init. Killing it (or its
//! parent dying) kills the whole tree, however it forked. Before the
//! command starts it loses every capability for good (`SECBIT_NOROOT` and
//! an empty bounding set), so it can neither raise a cap nor use its user
//! namespace's root.
//!
//! ## What caps a command's processes ([`ProcessCaps`])
//!
//! - On Linux 6.14 and newer, the namespace's `pid_max`, set by the init
//!   before the command starts: the command and everything it starts hold
//!   at most `max(max_processes, 300)` processes at once (the kernel's
//!   smallest `pid_max` is 301). If that write fails the command is not run.
//! - `RLIMIT_NPROC`, set on the runner and inherited by its commands. The
//!   kernel counts it per user and user namespace, so it covers the runner's
//!   own threads and all its commands together. `copy_process` does not
//!   apply it to a process whose real uid is the host's root, in whatever
//!   user namespace (the other exemption, capabilities in the host's user
//!   namespace, no runner has). So for a keel running as root it caps
//!   nothing, and mapping commands to another user is no way out: they
//!   could no longer write a workspace that root owns.
//!
//! The runner reports what is in force, in [`Confinement::processes`]:
//! `pid-namespace+pid_max:300`, `pid-namespace+rlimit:64`, both, or
//! `pid-namespace+uncapped`: root on a kernel before 6.14, or a runner
//! started inside another user namespace, which cannot tell whose uid it
//! has on the host and so claims no `RLIMIT_NPROC` cap. Uncapped, a fork
//! bomb runs until the call's timeout, and dies whole with its namespace.
//!
//! [`FORCE_NPROC_FALLBACK`] set to `1` in the runner's environment skips
//! `pid_max`, so that the older kernels' path can be tested and diagnosed on
//! a new one. It only ever removes a cap, and the report says so.
//!
//! The attacks, in `tests/sandbox.rs`: a bounded probe counts the
//! processes a command gets against the report, natively and under the
//! forced fallback, as root and as an unprivileged user; a fork bomb then
//! runs wherever the probe saw a cap hold, and must end, leave nothing and
//! leave the runner serving.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

use std::os::fd::{OwnedFd, RawFd};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

use crate::protocol::{Confinement, SandboxPolicy};

/// The per-namespace process cap, written by each command's init helper.
const PID_MAX: &str = "/proc/sys/kernel/pid_max";
/// The smallest `pid_max` the kernel accepts.
const PID_MAX_MIN: u64 = 301;

/// A test and diagnostic knob: `1` in the runner's environment makes it cap
/// processes as on kernels before 6.14 (no `pid_max`, `RLIMIT_NPROC` only).
pub const FORCE_NPROC_FALLBACK: &str = "KEEL_RUNNER_FORCE_NPROC_FALLBACK";

/// Folders every command needs to read (programs, libraries, their
/// configuration); those that do not exist are skipped.
pub const SYSTEM_READ: &[&str] =
    &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc"];
/// Devices commands may read and write.
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

fn errno(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// The caps in force on a runner's processes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessCaps {
    /// Processes each command may hold at once, by its namespace's
    /// `pid_max` (which is one more).
    pub per_command: Option<u64>,
    /// Processes and threads the runner and its commands may hold together,
    /// by `RLIMIT_NPROC`; `None` where the kernel does not enforce it.
    pub per_runner: Option<u64>,
}

impl ProcessCaps {
    /// The caps for `max_processes`, decided before the runner leaves its
    /// user namespace.
    fn decide(max_processes: u64) -> ProcessCaps {
        let forced = std::env::var(FORCE_NPROC_FALLBACK).is_ok_and(|v| v == "1");
        let per_command = (!forced && pid_max_per_namespace()).then(|| max_processes.max(PID_MAX_MIN - 1));
        // SAFETY: getuid takes no arguments and cannot fail.
        let uid = unsafe { libc::getuid() };
        let user_ns = std::fs::read_link("/proc/self/ns/user").unwrap_or_default();
        let per_runner = nproc_binds(uid, &user_ns.to_string_lossy()).then_some(max_processes);
        ProcessCaps { per_command, per_runner }
    }

    /// The `pid_max` each command's namespace gets.
    pub fn pid_max(&self) -> Option<u64> {
        self.per_command.map(|n| n.saturating_add(1))
    }

    /// How [`Confinement::processes`] reports them.
    pub fn describe(&self) -> String {
        let mut text = String::from("pid-namespace");
        if let Some(n) = self.per_command {
            text.push_str(&format!("+pid_max:{n}"));
        }
        if let Some(n) = self.per_runner {
            text.push_str(&format!("+rlimit:{n}"));
        }
        if self.per_command.is_none() && self.per_runner.is_none() {
            text.push_str("+uncapped");
        }
        text
    }
}

/// `/proc/self/ns/user` in the host's user namespace (the kernel's
/// `PROC_USER_INIT_INO`).
const INITIAL_USER_NS: &str = "user:[4026531837]";

/// Whether `RLIMIT_NPROC` binds a process of `uid` in the user namespace
/// `user_ns` (the target of `/proc/self/ns/user`). The kernel exempts the
/// host's root only, but from inside another user namespace (a rootless
/// container, say) a process cannot tell whose uid it is on the host: the
/// answer is then no, so the report never claims a cap it cannot vouch for.
fn nproc_binds(uid: u32, user_ns: &str) -> bool {
    uid != 0 && user_ns == INITIAL_USER_NS
}

/// Confines the calling process as `policy` says (everything but
/// Landlock). Must run before any thread is started.
pub fn confine_process(policy: &SandboxPolicy) -> Result<(Confinement, ProcessCaps), String> {
    // SAFETY: prctl with integer arguments has no memory effects.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(errno("cannot set no_new_privs"));
    }
    let caps = ProcessCaps::decide(policy.shell.max_processes);
    namespaces(policy.network)?;
    limits(policy)?;
    die_with_keel()?;
    let confinement = Confinement {
        filesystem: String::new(),
        network: if policy.network { "allowed" } else { "isolated" }.into(),
        processes: caps.describe(),
        environment: "clean".into(),
    };
    Ok((confinement, caps))
}

/// The runner dies with SIGKILL when keel does (and its commands with it):
/// set after the namespaces, since changing credentials clears the setting.
fn die_with_keel() -> Result<(), String> {
    // SAFETY: prctl and getppid with integer arguments.
    unsafe {
        let parent = libc::getppid();
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(errno("cannot tie the runner's life to keel's"));
        }
        // Keel died before the setting took effect.
        if libc::getppid() != parent {
            return Err("keel exited while the runner started".into());
        }
    }
    Ok(())
}

fn namespaces(network: bool) -> Result<(), String> {
    // SAFETY: plain system calls with integer arguments.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut flags = libc::CLONE_NEWUSER;
    if !network {
        flags |= libc::CLONE_NEWNET;
    }
    // SAFETY: unshare takes flags only; the process is single-threaded here.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(format!(
            "{}; the sandbox needs user namespaces (check the sysctls kernel.unprivileged_userns_clone and user.max_user_namespaces, or the container's seccomp profile)",
            errno("cannot create the sandbox's user namespace")
        ));
    }
    // Root inside, the caller outside: enough to make a PID namespace per
    // command, and nothing on the host.
    let write = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file} for the sandbox's user namespace: {e}"))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    write("/proc/self/gid_map", format!("0 {gid} 1"))?;
    Ok(())
}

fn set_limit(resource: libc::__rlimit_resource_t, value: u64, what: &str) -> Result<(), String> {
    let limit = libc::rlimit { rlim_cur: value, rlim_max: value };
    // SAFETY: the pointer is to a live, initialised struct.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(errno(&format!("cannot limit {what}")));
    }
    Ok(())
}

fn limits(policy: &SandboxPolicy) -> Result<(), String> {
    set_limit(libc::RLIMIT_CORE, 0, "core dumps")?;
    set_limit(libc::RLIMIT_NPROC, policy.shell.max_processes, "processes")?;
    set_limit(libc::RLIMIT_FSIZE, policy.shell.max_file_bytes, "file size")?;
    Ok(())
}

/// The kernel's Landlock ABI, 0 when it has none.
pub fn kernel_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer and the VERSION flag the call
    // only returns a number.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    version.max(0)
}

/// The Landlock ruleset for `policy`, and a second descriptor of it for
/// commands.
pub fn ruleset(policy: &SandboxPolicy, runner_exe: &Path) -> Result<(RulesetCreated, OwnedFd), String> {
    let failed = |e: landlock::RulesetError| format!("cannot set up Landlock: {e}");
    let kernel = kernel_abi();
    if kernel < 1 {
        return Err("the kernel has no Landlock (Linux 5.13 or newer with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= boot parameter is needed); keel does not run tools unconfined".into());
    }
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let file_only = AccessFs::from_file(abi);
    let mut ruleset =
        Ruleset::default().set_compatibility(CompatLevel::BestEffort).handle_access(all).map_err(failed)?;
    if !policy.network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(failed)?;
    }
    if kernel >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(failed)?;
    }
    let mut rules: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    rules.push((policy.workspace.clone(), all));
    rules.push((policy.scratch.clone(), all));
    rules.extend(policy.write.iter().map(|p| (p.clone(), all)));
    rules.extend(policy.read.iter().map(|p| (p.clone(), read)));
    rules.extend(SYSTEM_READ.iter().map(|p| (PathBuf::from(p), read)));
    rules.extend(DEVICES.iter().map(|p| (PathBuf::from(p), file_only & !AccessFs::Execute)));
    rules.push((runner_exe.to_path_buf(), AccessFs::ReadFile | AccessFs::Execute));
    let mut created = ruleset.create().map_err(failed)?;
    for (path, access) in rules {
        let Ok(fd) = PathFd::new(&path) else {
            // Absent system folders and devices are fine; the policy's own
            // folders were checked by keel before it started the runner.
            continue;
        };
        let access = if path.is_dir() { access } else { access & file_only };
        created = created.add_rule(PathBeneath::new(fd, access)).map_err(failed)?;
    }
    let copy = created.try_clone().map_err(|e| format!("cannot set up Landlock: {e}"))?;
    let fd: Option<OwnedFd> = copy.into();
    let fd = fd.ok_or("Landlock is present but gave no ruleset; keel does not run tools unconfined")?;
    Ok((created, fd))
}

/// Enforces `ruleset` on the calling thread (and what it creates later);
/// returns the ABI it was enforced at.
pub fn restrict_thread(ruleset: RulesetCreated) -> Result<i64, String> {
    let status = ruleset.restrict_self().map_err(|e| format!("cannot enforce Landlock: {e}"))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("Landlock is present but refused to enforce the ruleset; keel does not run tools unconfined".into());
    }
    Ok(match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as i64,
        _ => kernel_abi().min(6),
    })
}

/// Prepares a command's init helper: it dies with SIGKILL when the thread
/// that spawned it exits (so no command outlives its runner), and it
/// inherits `ruleset` (whose number it is told on its command line).
pub fn spawn_init(command: &mut tokio::process::Command, ruleset: RawFd) {
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, fcntl).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The descriptor is close-on-exec in the runner; keep it open
            // across this one exec.
            if libc::fcntl(ruleset, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether the kernel keeps `pid_max` per PID namespace (Linux 6.14).
fn pid_max_per_namespace() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 14)
}

/// The init helper: `<exe> __keel-runner-init <ruleset-fd> <pid-max|->
/// <program> <args...>`. Runs the program as the init of a new PID
/// namespace whose `pid_max` it sets (`-`: left as it is), under the
/// Landlock ruleset, without capabilities; waits for it, and exits with its
/// status (128 + signal when it was killed).
pub fn run_init(args: &[String]) -> ! {
    let pid_max = match args.get(1).map(String::as_str) {
        Some("-") => Some(None),
        Some(n) => n.parse::<u64>().ok().map(|n| Some(n.max(PID_MAX_MIN).to_string())),
        None => None,
    };
    let (Some(ruleset), Some(pid_max), Some(program)) =
        (args.first().and_then(|fd| fd.parse::<RawFd>().ok()), pid_max, args.get(2))
    else {
        eprintln!("keel runner init: usage: __keel-runner-init <ruleset-fd> <pid-max|-> <program> [args...]");
        std::process::exit(125);
    };
    // SAFETY: unshare takes flags only; this process is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        eprintln!("keel runner init: {}", errno("cannot create a PID namespace"));
        std::process::exit(125);
    }
    let mut command = std::process::Command::new(program);
    command.args(&args[3..]);
    let path = CString::new(PID_MAX).unwrap_or_default();
    let refused = format!("keel runner init: cannot set the command's process cap ({PID_MAX}); it was not run\n");
    // SAFETY: the closure runs between fork and exec in the namespace's
    // init and calls only async-signal-safe functions (prctl, open, write,
    // close, landlock_restrict_self) on memory prepared before the fork. This process is
    // single-threaded, so the parent-death signal is tied to the process
    // that waits.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(pid_max) = &pid_max {
                // The runner reported this cap: without it, nothing runs.
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                let written = if fd >= 0 { libc::write(fd, pid_max.as_ptr().cast(), pid_max.len()) } else { -1 };
                let error = io::Error::last_os_error();
                if fd >= 0 {
                    libc::close(fd);
                }
                if usize::try_from(written).ok() != Some(pid_max.len()) {
                    libc::write(2, refused.as_ptr().cast(), refused.len());
                    return Err(error);
                }
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::close(ruleset);
            drop_capabilities()
        });
    }
    let status = match command.status() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("keel runner init: cannot start {program}: {e}");
            std::process::exit(127);
        }
    };
    use std::os::unix::process::ExitStatusExt;
    std::process::exit(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// Makes the coming `exec` yield no capabilities, and every later one too:
/// root of the user namespace gets none (`SECBIT_NOROOT`, locked) and the
/// bounding set is emptied.
///
/// # Safety
/// Async-signal-safe; meant for a `pre_exec` closure.
unsafe fn drop_capabilities() -> io::Result<()> {
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
    const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED;
    // SAFETY: prctl with integer arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        for cap in 0..64 {
            // EINVAL past the last capability the kernel knows.
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && cap < 41 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Sends SIGKILL to a process (used on the init helper, which takes its
/// namespace down with it).
pub fn kill(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill with integer arguments.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rlimit_nproc_is_reported_only_where_it_provably_binds() {
        let nested = "user:[4026532178]";
        for (uid, user_ns, binds) in [
            (1000, INITIAL_USER_NS, true), // a host user
            (0, INITIAL_USER_NS, false),   // the host's root: exempt
            (1000, nested, false),         // cannot tell who that is on the host
            (0, nested, false),
            (1000, "", false), // the link could not be read
        ] {
            assert_eq!(nproc_binds(uid, user_ns), binds, "uid {uid} in {user_ns:?}");
        }
    }

    #[test]
    fn the_report_names_every_cap_in_force_or_none() {
        for (per_command, per_runner, report, pid_max) in [
            (Some(300), None, "pid-namespace+pid_max:300", Some(301)),
            (Some(512), Some(512), "pid-namespace+pid_max:512+rlimit:512", Some(513)),
            (None, Some(64), "pid-namespace+rlimit:64", None),
            (None, None, "pid-namespace+uncapped", None),
        ] {
            let caps = ProcessCaps { per_command, per_runner };
            assert_eq!(caps.describe(), report);
            assert_eq!(caps.pid_max(), pid_max);
        }
    }
}
